// mHC on the GPU (see ops/hc.h), all fp32.
// hc_pre / hc_head: two kernels. The first computes the sum of squares and
// all (2+hc)·hc (head: hc) dot products with fn as partial sums over chunks of
// the flattened hc·D vector (many CTAs: fn is streamed once per token tile);
// the second adds a token's partials in a fixed order and, in two CTAs per
// token, applies the pre gates and collapses the streams (CTA t, 0) while one
// warp makes the post gates and the Sinkhorn normalisation (CTA t, 1: a 4×4
// matrix, latency, not throughput; a lane per element).
// hc_post: one thread per (token, channel) updates all hc streams (in place,
// or into another buffer).
// The fused forms the step runs: hc_post + the next hc_pre's partial sums in
// one kernel (out of place: a CTA reads every stream of its channels while
// other CTAs write theirs), and the finishing kernel + the RMSNorm of the
// collapsed row (+ its bf16 copy for the next linears) in one kernel; both
// give the bits of the unfused kernels (see the kernels).
#include "backend/cuda/core/cuda_util.h"
#include "backend/cuda/norm/norm_device.cuh"
#include "backend/cuda/core/ops_device.cuh"
#include "ops/hc.h"

namespace cm {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kNormMaxDim = 12288;  // 48 KiB of shared memory per row

struct HcKParams {
  const float* fn;
  const float* base;
  const float* scale;
  int64_t dim;
  int iters;
  float hc_eps, norm_eps;
  const float* x;
  float* collapsed;
  float* post;  // null for hc_head
  float* comb;
};

__device__ __forceinline__ float sigmoid(float v) { return 1.0f / (1.0f + expf(-v)); }

// Same operations as hc_sinkhorn (backend/cpu/hc.cpp) in registers: lane l < HC·HC holds element
// (l / HC, l % HC), and a row or column sum gathers its HC values by shuffles and adds them in the
// serial loop's order, so every element gets the bits of the shared-memory version (and of the
// serial loop on one thread: ~10 µs of dependent divisions per token). Per iteration: HC shuffles,
// HC adds and one division per step, no shared memory and no barrier (the shared-memory version
// with a thread per row / column took ~6 µs of a one-token step's ~15 µs finishing kernel).
// Called by a whole warp; c is read and written in shared memory at entry and exit.
template <int HC>
__device__ void sinkhorn_warp(float* c, int iters, float eps) {
  static_assert(HC * HC <= 32, "one element per lane");
  constexpr unsigned kAll = 0xffffffffu;
  const int l = threadIdx.x & 31;
  const bool own = l < HC * HC;
  const int r = own ? l / HC : 0, col = own ? l % HC : 0;
  float v = own ? c[l] : 0.f;
  float m = __shfl_sync(kAll, v, r * HC);
#pragma unroll
  for (int k = 1; k < HC; ++k) m = fmaxf(m, __shfl_sync(kAll, v, r * HC + k));
  const float e = expf(v - m);
  float s = 0;
#pragma unroll
  for (int k = 0; k < HC; ++k) s += __shfl_sync(kAll, e, r * HC + k);
  v = e / s + eps;
  for (int it = 0; it < iters; ++it) {
    if (it > 0) {
      s = 0;
#pragma unroll
      for (int k = 0; k < HC; ++k) s += __shfl_sync(kAll, v, r * HC + k);
      v /= (s + eps);
    }
    s = 0;
#pragma unroll
    for (int j = 0; j < HC; ++j) s += __shfl_sync(kAll, v, j * HC + col);
    v /= (s + eps);
  }
  if (own) c[l] = v;
  __syncwarp();
}

// The mixing dot products are split over the flattened hc·D vector: CTA
// (chunk, token tile) sums elements [chunk·kChunk, (chunk+1)·kChunk) of every
// token of its tile — one pass over its slice of fn serves the whole tile —
// and writes one partial per (token, chunk, row). A token's partials are then
// summed in a fixed order by the finishing kernel. The arithmetic of a token
// depends only on kChunk, never on how many tokens share the step, so one
// prefill and any chunking give the same bits. At decode (one token) the old
// one-CTA-per-token kernel read fn (1.5 MB for V4-Flash) on a single SM
// (~240 µs); split over 32 CTAs it streams at full bandwidth. (256-element
// chunks, 64 CTAs, doubled the prefill's per-chunk reductions: +38% for the
// fused post on 2K tokens.)
constexpr int kChunk = 512;   // elements of hc·D per CTA, two per thread
static_assert(kChunk % kThreads == 0, "whole elements per thread");
constexpr int kTileT = 2;     // tokens per CTA (the accumulators stay in registers); 1 for a one-token step

int64_t n_chunks(int64_t hc, int64_t dim) { return (hc * dim + kChunk - 1) / kChunk; }

// The values the partial sums read: the streams as stored (hc_pre), or (the fused hc_post + next
// hc_pre) each element's new value, computed, stored and summed in one pass.
struct LoadStored {
  const float* x;
  __device__ __forceinline__ float operator()(int64_t t, int64_t n, int64_t i) const { return x[t * n + i]; }
};

// X'_k[d] = post_k · out[d] + Σ_j comb[j][k] · X_j[d] of one token (ops/hc.h), with the multiply and
// the fused multiply-adds spelled out, so hc_post_kernel and the fused kernel round alike.
template <int HC>
__device__ __forceinline__ float post_value(float post_k, float o, const float* comb_col, const float* old) {
  float s = __fmul_rn(post_k, o);
#pragma unroll
  for (int j = 0; j < HC; ++j) s = __fmaf_rn(comb_col[j * HC], old[j], s);
  return s;
}

template <int HC>
struct LoadPosted {
  const float* x_in;  // [T, HC, D], never written by the kernel
  float* x_out;       // [T, HC, D]
  const float *out, *post, *comb;
  int64_t dim;
  __device__ __forceinline__ float operator()(int64_t t, int64_t n, int64_t i) const {
    const int64_t k = i / dim, d = i - k * dim;
    const float* xt = x_in + t * n;
    float old[HC];
#pragma unroll
    for (int j = 0; j < HC; ++j) old[j] = xt[j * dim + d];
    const float v = post_value<HC>(post[t * HC + k], out[t * dim + d], comb + t * HC * HC + k, old);
    x_out[t * n + i] = v;
    return v;
  }
};

// TT tokens per CTA: a token's sums do not depend on TT (each token has its own accumulators, reduced
// in the same order), so the one-token variant, which halves the warp reductions at decode, gives the
// same bits as the two-token tile. Every element of the chunk is loaded (load) exactly once, by the
// same thread whatever the loader, so the fused post gives hc_pre's partials bit for bit.
template <int HC, bool HEAD, int TT, class Load>
__device__ __forceinline__ void mix_partial(const HcKParams& p, int64_t tokens, float* part, const Load& load) {
  constexpr int R = HEAD ? HC : (2 + HC) * HC;
  __shared__ float red[kThreads / 32][TT][R + 1];
  const int64_t n = HC * p.dim, chunk = blockIdx.x, nch = gridDim.x, t0 = int64_t(blockIdx.y) * TT;
  float acc[TT][R + 1];
#pragma unroll
  for (int u = 0; u < TT; ++u)
#pragma unroll
    for (int r = 0; r <= R; ++r) acc[u][r] = 0.f;
  // A thread's kPer elements i0, i0 + kThreads, …: every load (fn's columns
  // through the read-only path, then the streams) is issued before the first
  // multiply, so a one-token step waits for memory once, not once per element
  // and again behind the fused post's stores; the adds keep the element order.
  constexpr int kPer = kChunk / kThreads;
  const int64_t lo = chunk * kChunk, hi = min(n, lo + kChunk);
  float f[kPer][R];
#pragma unroll
  for (int q = 0; q < kPer; ++q) {
    const int64_t i = lo + threadIdx.x + q * kThreads;
#pragma unroll
    for (int r = 0; r < R; ++r) f[q][r] = i < hi ? __ldg(p.fn + r * n + i) : 0.f;
  }
  float v[kPer][TT];
#pragma unroll
  for (int q = 0; q < kPer; ++q) {
    const int64_t i = lo + threadIdx.x + q * kThreads;
#pragma unroll
    for (int u = 0; u < TT; ++u) v[q][u] = i < hi && t0 + u < tokens ? load(t0 + u, n, i) : 0.f;
  }
#pragma unroll
  for (int q = 0; q < kPer; ++q) {
    if (lo + threadIdx.x + q * kThreads >= hi) break;
#pragma unroll
    for (int u = 0; u < TT; ++u) {
      acc[u][R] += v[q][u] * v[q][u];
#pragma unroll
      for (int r = 0; r < R; ++r) acc[u][r] += v[q][u] * f[q][r];
    }
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int u = 0; u < TT; ++u)
#pragma unroll
    for (int r = 0; r <= R; ++r) {
      const float s = cuda::dev::warp_sum(acc[u][r]);
      if (lane == 0) red[warp][u][r] = s;
    }
  __syncthreads();
  for (int k = threadIdx.x; k < TT * (R + 1); k += kThreads) {
    const int u = k / (R + 1), r = k % (R + 1);
    if (t0 + u >= tokens) continue;
    float s = 0.f;
    for (int w = 0; w < kThreads / 32; ++w) s += red[w][u][r];
    part[((t0 + u) * nch + chunk) * (R + 1) + r] = s;
  }
}

template <int HC, bool HEAD, int TT>
__global__ void __launch_bounds__(kThreads) hc_mix_partial_kernel(const HcKParams p, int64_t tokens, float* part) {
  cuda::dev::pdl_wait_and_release();
  mix_partial<HC, HEAD, TT>(p, tokens, part, LoadStored{p.x});
}

// hc_post out of place (x_in → x_out) fused with the partial sums of the next hc_pre (p: its fn and
// dim) over the values it writes: the same grid and element → thread mapping as hc_mix_partial_kernel.
template <int HC, int TT>
__global__ void __launch_bounds__(kThreads) hc_post_mix_kernel(const HcKParams p, const LoadPosted<HC> load,
                                                               int64_t tokens, float* part) {
  cuda::dev::pdl_wait_and_release();
  mix_partial<HC, false, TT>(p, tokens, part, load);
}

// Two CTAs per token (one for hc_head): both sum the partials in a fixed
// order; CTA (t, 0) applies the pre gates and collapses the streams while
// warp 0 of CTA (t, 1) makes the post gates and the Sinkhorn-normalised comb. NORM: the
// collapsed row is then RMS-normed in the same CTA (norm_device.cuh; launched
// with rms_norm_threads(dim) threads and the row in dynamic shared memory, so
// the normed row has the RMSNorm kernel's bits); collapsed may then be null.
struct NormOut {
  const float* w;  // null: unweighted
  float eps;
  float* y;        // [T, D] f32
  uint16_t* copy;  // null, or the bf16 copy of y
};

template <int HC, bool HEAD, bool NORM>
__global__ void __launch_bounds__(NORM ? 1024 : kThreads)
    hc_mix_finish_kernel(const HcKParams p, int64_t nch, const float* part, const NormOut no) {
  constexpr int R = HEAD ? HC : (2 + HC) * HC;
  cuda::dev::pdl_wait_and_release();
  extern __shared__ float row[];  // NORM: [dim]
  __shared__ float mix[R + 1];
  __shared__ float pre[HC];
  __shared__ float cm[HC * HC];
  __shared__ float tmp[32];
  const int64_t t = blockIdx.x, n = HC * p.dim;
  const float* x = p.x + t * n;
  // A warp per mixing row: lane l adds chunks l, l + 32, … in order, then the
  // lanes' sums meet in a fixed shuffle tree (lane 0's result): a fixed order
  // per token, the loads spread over the warp.
  {
    const int lane = threadIdx.x & 31;
    for (int r = threadIdx.x >> 5; r <= R; r += blockDim.x >> 5) {
      float s = 0.f;
      for (int64_t c = lane; c < nch; c += 32) s += part[(t * nch + c) * (R + 1) + r];
      s = cuda::dev::warp_sum(s);
      if (lane == 0) mix[r] = s;
    }
  }
  __syncthreads();
  const float inv = 1.0f / sqrtf(mix[R] / float(n) + p.norm_eps);
  if constexpr (!HEAD) {
    // CTA (t, 1): the post gates and the Sinkhorn-normalised comb, which only the
    // hc_post after the attention / MoE block reads, in parallel with CTA (t, 0)'s
    // collapse and norm (one CTA ran them one after the other).
    if (blockIdx.y == 1) {
      if (threadIdx.x < 32) {
        const int k = threadIdx.x;
        if (k < HC) p.post[t * HC + k] = 2.0f * sigmoid(mix[HC + k] * inv * p.scale[1] + p.base[HC + k]);
        for (int i = k; i < HC * HC; i += 32) cm[i] = mix[2 * HC + i] * inv * p.scale[2] + p.base[2 * HC + i];
        __syncwarp();
        sinkhorn_warp<HC>(cm, p.iters, p.hc_eps);
        for (int i = k; i < HC * HC; i += 32) p.comb[t * HC * HC + i] = cm[i];
      }
      return;
    }
  }
  if (threadIdx.x < HC) pre[threadIdx.x] = sigmoid(mix[threadIdx.x] * inv * p.scale[0] + p.base[threadIdx.x]) + p.hc_eps;
  __syncthreads();
  float pk[HC];
#pragma unroll
  for (int k = 0; k < HC; ++k) pk[k] = pre[k];
  float ss = 0.f;
  for (int64_t d = threadIdx.x; d < p.dim; d += blockDim.x) {
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < HC; ++k) s += pk[k] * x[k * p.dim + d];
    if (!NORM || p.collapsed) p.collapsed[t * p.dim + d] = s;
    if constexpr (NORM) {
      row[d] = s;
      ss += s * s;
    }
  }
  if constexpr (NORM) {
    cuda::dev::rms_norm_row(row, ss, no.w, p.dim, no.eps, tmp);
    for (int64_t d = threadIdx.x; d < p.dim; d += blockDim.x)
      cuda::dev::store_normed(no.y, false, no.copy, t * p.dim + d, row[d]);
  }
}

template <int HC>
__global__ void hc_post_kernel(int64_t dim, const float* out, const float* post, const float* comb, int64_t tokens,
                               const float* x_in, float* x_out) {
  cuda::dev::pdl_wait_and_release();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= tokens * dim) return;
  const int64_t t = i / dim, d = i % dim;
  const float* xt = x_in + t * HC * dim;
  float old[HC];
#pragma unroll
  for (int j = 0; j < HC; ++j) old[j] = xt[j * dim + d];
  const float o = out[t * dim + d];
  const float* c = comb + t * HC * HC;
#pragma unroll
  for (int k = 0; k < HC; ++k) x_out[t * HC * dim + k * dim + d] = post_value<HC>(post[t * HC + k], o, c + k, old);
}

// The partial sums' grid: a CTA per chunk and token tile (one-token tiles for a one-token step).
template <class K1, class K2, class... Args>
void launch_partial(cuda::Context& ctx, K1 one, K2 tile, int64_t nch, int64_t tokens, const char* name, Args... args) {
  const dim3 block{unsigned(kThreads)};
  if (tokens == 1)
    cuda::launch_kernel(ctx, one, dim3(unsigned(nch), 1u), block, 0, name, args...);
  else
    cuda::launch_kernel(ctx, tile, dim3(unsigned(nch), unsigned((tokens + kTileT - 1) / kTileT)), block, 0, name,
                        args...);
}

// partials: launch the partial-sum kernel first (else the scratch holds them already); norm: fuse the
// RMSNorm of the collapsed rows into the finishing kernel.
template <int HC, bool HEAD>
void launch_mix_hc(cuda::Context& ctx, const HcKParams& p, int64_t tokens, float* part, bool partials,
                   const NormOut* norm) {
  const int64_t nch = n_chunks(HC, p.dim);
  if (partials)
    launch_partial(ctx, hc_mix_partial_kernel<HC, HEAD, 1>, hc_mix_partial_kernel<HC, HEAD, kTileT>, nch, tokens,
                   "hc_mix_partial_kernel", p, tokens, part);
  const dim3 grid(unsigned(tokens), HEAD ? 1u : 2u);  // (t, 1): post and comb (hc_pre only)
  if (norm)
    cuda::launch_kernel(ctx, hc_mix_finish_kernel<HC, HEAD, true>, grid,
                        dim3(unsigned(cuda::rms_norm_threads(p.dim))), size_t(p.dim) * 4, "hc_mix_finish_norm_kernel",
                        p, nch, static_cast<const float*>(part), *norm);
  else
    cuda::launch_kernel(ctx, hc_mix_finish_kernel<HC, HEAD, false>, grid, dim3(unsigned(kThreads)),
                        0, "hc_mix_finish_kernel", p, nch, static_cast<const float*>(part), NormOut{});
}

template <bool HEAD>
void launch_mix(cuda::Context& ctx, int64_t hc, const HcKParams& p, int64_t tokens, float* part, bool partials = true,
                const NormOut* norm = nullptr) {
  CM_CU_CHECK(part, "hc: no scratch for the partial sums (hc_mix_scratch_floats)");
  CM_CU_CHECK((tokens + kTileT - 1) / kTileT < 65536, "hc: %lld tokens exceed the grid", (long long)tokens);
  switch (hc) {
    case 1: launch_mix_hc<1, HEAD>(ctx, p, tokens, part, partials, norm); break;
    case 2: launch_mix_hc<2, HEAD>(ctx, p, tokens, part, partials, norm); break;
    case 3: launch_mix_hc<3, HEAD>(ctx, p, tokens, part, partials, norm); break;
    default: launch_mix_hc<4, HEAD>(ctx, p, tokens, part, partials, norm); break;
  }
}

template <int HC>
void launch_post(cuda::Context& ctx, int64_t dim, const float* out, const float* post, const float* comb,
                 int64_t tokens, const float* x_in, float* x_out, const HcParams* next, float* part) {
  if (!next) {
    const int64_t n = tokens * dim;
    cuda::launch_kernel(ctx, hc_post_kernel<HC>, dim3(unsigned((n + 255) / 256)), dim3(256u), 0, "hc_post_kernel", dim,
                        out, post, comb, tokens, x_in, x_out);
    return;
  }
  const HcKParams p{next->fn, next->base, next->scale, dim, int(next->sinkhorn_iters), next->hc_eps, next->norm_eps,
                    nullptr, nullptr, nullptr, nullptr};
  const LoadPosted<HC> load{x_in, x_out, out, post, comb, dim};
  launch_partial(ctx, hc_post_mix_kernel<HC, 1>, hc_post_mix_kernel<HC, kTileT>, n_chunks(HC, dim), tokens,
                 "hc_post_mix_kernel", p, load, tokens, part);
}

void check_hc(const char* what, int64_t hc, int64_t dim, int64_t tokens) {
  CM_CU_CHECK(hc >= 1 && hc <= 4, "%s: hc_mult %lld unsupported on the GPU (1..4)", what, (long long)hc);
  CM_CU_CHECK(dim > 0 && tokens < (int64_t(1) << 31), "%s: bad shape (dim %lld, %lld tokens)", what, (long long)dim,
              (long long)tokens);
}

// The fused norm stages a row in shared memory, as rms_norm_cuda does (and with its limit).
void check_norm(const char* what, int64_t dim, const HcNormOut& norm) {
  CM_CU_CHECK(dim <= kNormMaxDim, "%s: row length %lld above the fused RMSNorm's %lld", what, (long long)dim,
              (long long)kNormMaxDim);
  CM_CU_CHECK(norm.y, "%s: no output for the normed rows", what);
}

}  // namespace

size_t hc_mix_scratch_floats(int64_t hc, int64_t dim, int64_t tokens) {
  return size_t(tokens * n_chunks(hc, dim) * ((2 + hc) * hc + 1));
}

void hc_pre_cuda(cuda::Context& ctx, const HcParams& p, const float* x, int64_t tokens, float* collapsed, float* post,
                 float* comb, float* scratch) {
  check_hc("hc_pre_cuda", p.hc, p.dim, tokens);
  CM_CU_CHECK(p.sinkhorn_iters >= 1, "hc_pre_cuda: sinkhorn_iters must be >= 1");
  if (tokens <= 0) return;
  HcKParams k{p.fn, p.base, p.scale, p.dim, int(p.sinkhorn_iters), p.hc_eps, p.norm_eps, x, collapsed, post, comb};
  launch_mix<false>(ctx, p.hc, k, tokens, scratch);
}

void hc_head_cuda(cuda::Context& ctx, const HcHeadParams& p, const float* x, int64_t tokens, float* y, float* scratch) {
  check_hc("hc_head_cuda", p.hc, p.dim, tokens);
  if (tokens <= 0) return;
  HcKParams k{p.fn, p.base, p.scale, p.dim, 0, p.hc_eps, p.norm_eps, x, y, nullptr, nullptr};
  launch_mix<true>(ctx, p.hc, k, tokens, scratch);
}

void hc_post_cuda(cuda::Context& ctx, int64_t hc, int64_t dim, const float* out, const float* post, const float* comb,
                  int64_t tokens, float* x) {
  hc_post_mix_cuda(ctx, hc, dim, out, post, comb, tokens, x, x, nullptr, nullptr);
}

void hc_post_mix_cuda(cuda::Context& ctx, int64_t hc, int64_t dim, const float* out, const float* post,
                      const float* comb, int64_t tokens, const float* x_in, float* x_out, const HcParams* next,
                      float* scratch) {
  check_hc(next ? "hc_post_mix_cuda" : "hc_post_cuda", hc, dim, tokens);
  if (next) {
    CM_CU_CHECK(x_in != x_out, "hc_post_mix_cuda: the fused post writes its streams out of place (x_in == x_out)");
    CM_CU_CHECK(next->hc == hc && next->dim == dim, "hc_post_mix_cuda: the next hc_pre is hc %lld x %lld, the post %lld x %lld",
                (long long)next->hc, (long long)next->dim, (long long)hc, (long long)dim);
    CM_CU_CHECK(scratch, "hc_post_mix_cuda: no scratch for the partial sums (hc_mix_scratch_floats)");
    CM_CU_CHECK((tokens + kTileT - 1) / kTileT < 65536, "hc: %lld tokens exceed the grid", (long long)tokens);
  }
  if (tokens <= 0) return;
  switch (hc) {
    case 1: launch_post<1>(ctx, dim, out, post, comb, tokens, x_in, x_out, next, scratch); break;
    case 2: launch_post<2>(ctx, dim, out, post, comb, tokens, x_in, x_out, next, scratch); break;
    case 3: launch_post<3>(ctx, dim, out, post, comb, tokens, x_in, x_out, next, scratch); break;
    default: launch_post<4>(ctx, dim, out, post, comb, tokens, x_in, x_out, next, scratch); break;
  }
}

void hc_pre_norm_cuda(cuda::Context& ctx, const HcParams& p, const float* x, int64_t tokens, float* collapsed,
                      float* post, float* comb, float* scratch, const HcNormOut& norm, bool partials_ready) {
  check_hc("hc_pre_norm_cuda", p.hc, p.dim, tokens);
  CM_CU_CHECK(p.sinkhorn_iters >= 1, "hc_pre_norm_cuda: sinkhorn_iters must be >= 1");
  check_norm("hc_pre_norm_cuda", p.dim, norm);
  if (tokens <= 0) return;
  HcKParams k{p.fn, p.base, p.scale, p.dim, int(p.sinkhorn_iters), p.hc_eps, p.norm_eps, x, collapsed, post, comb};
  const NormOut no{norm.w, norm.eps, norm.y, norm.y_copy_bf16};
  launch_mix<false>(ctx, p.hc, k, tokens, scratch, !partials_ready, &no);
}

void hc_head_norm_cuda(cuda::Context& ctx, const HcHeadParams& p, const float* x, int64_t tokens, float* scratch,
                       const HcNormOut& norm) {
  check_hc("hc_head_norm_cuda", p.hc, p.dim, tokens);
  check_norm("hc_head_norm_cuda", p.dim, norm);
  if (tokens <= 0) return;
  HcKParams k{p.fn, p.base, p.scale, p.dim, 0, p.hc_eps, p.norm_eps, x, nullptr, nullptr, nullptr};
  const NormOut no{norm.w, norm.eps, norm.y, norm.y_copy_bf16};
  launch_mix<true>(ctx, p.hc, k, tokens, scratch, true, &no);
}

}  // namespace cm
