// mHC on the GPU (see ops/hc.h), all fp32.
// hc_pre / hc_head: two kernels. The first computes the sum of squares and
// all (2+hc)·hc (head: hc) dot products with fn as partial sums over chunks of
// the flattened hc·D vector (many CTAs: fn is streamed once per token tile);
// the second, one CTA per token, adds a token's partials in chunk order, its
// first warp applies the sigmoid gates and the Sinkhorn normalisation (a 4×4
// matrix: latency, not throughput; a lane per row / column), and all threads
// collapse the streams.
// hc_post: one thread per (token, channel) updates all hc streams in place.
#include "backend/cuda/cuda_util.h"
#include "backend/cuda/ops_device.cuh"
#include "ops/hc.h"

namespace cm {

namespace {

constexpr int kThreads = 256;

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

// Same operations as hc_sinkhorn (backend/cpu/hc.cpp), each row and each column
// by its own thread: lanes j < HC of one warp own row j for the row steps and
// column j for the column steps (the rows, and the columns, are independent, so
// the results equal the serial loop's bit for bit; the serial loop on one
// thread was ~10 µs of dependent divisions per token).
template <int HC>
__device__ void sinkhorn_warp(float* c, int iters, float eps) {
  const int j = threadIdx.x & 31;
  if (j < HC) {
    float* row = c + j * HC;
    float m = row[0];
    for (int k = 1; k < HC; ++k) m = fmaxf(m, row[k]);
    float s = 0;
    for (int k = 0; k < HC; ++k) s += (row[k] = expf(row[k] - m));
    for (int k = 0; k < HC; ++k) row[k] = row[k] / s + eps;
  }
  __syncwarp();
  for (int it = 0; it < iters; ++it) {
    if (it > 0) {
      if (j < HC) {
        float s = 0;
        for (int k = 0; k < HC; ++k) s += c[j * HC + k];
        for (int k = 0; k < HC; ++k) c[j * HC + k] /= (s + eps);
      }
      __syncwarp();
    }
    if (j < HC) {
      float s = 0;
      for (int r = 0; r < HC; ++r) s += c[r * HC + j];
      for (int r = 0; r < HC; ++r) c[r * HC + j] /= (s + eps);
    }
    __syncwarp();
  }
}

// The mixing dot products are split over the flattened hc·D vector: CTA
// (chunk, token tile) sums elements [chunk·kChunk, (chunk+1)·kChunk) of every
// token of its tile — one pass over its slice of fn serves the whole tile —
// and writes one partial per (token, chunk, row). A token's partials are then
// summed in chunk order by the finishing kernel. The arithmetic of a token
// depends only on kChunk, never on how many tokens share the step, so one
// prefill and any chunking give the same bits. At decode (one token) the old
// one-CTA-per-token kernel read fn (1.5 MB for V4-Flash) on a single SM
// (~240 µs); split over 32 CTAs it streams at full bandwidth.
constexpr int kChunk = 512;   // elements of hc·D per CTA
constexpr int kTileT = 2;     // tokens per CTA (the accumulators stay in registers); 1 for a one-token step

int64_t n_chunks(int64_t hc, int64_t dim) { return (hc * dim + kChunk - 1) / kChunk; }

// TT tokens per CTA: a token's sums do not depend on TT (each token has its own accumulators, reduced
// in the same order), so the one-token variant, which halves the warp reductions at decode, gives the
// same bits as the two-token tile.
template <int HC, bool HEAD, int TT>
__global__ void __launch_bounds__(kThreads) hc_mix_partial_kernel(const HcKParams p, int64_t tokens, float* part) {
  constexpr int R = HEAD ? HC : (2 + HC) * HC;
  cuda::dev::pdl_wait_and_release();
  __shared__ float red[kThreads / 32][TT][R + 1];
  const int64_t n = HC * p.dim, chunk = blockIdx.x, nch = gridDim.x, t0 = int64_t(blockIdx.y) * TT;
  float acc[TT][R + 1];
#pragma unroll
  for (int u = 0; u < TT; ++u)
#pragma unroll
    for (int r = 0; r <= R; ++r) acc[u][r] = 0.f;
  for (int64_t i = chunk * kChunk + threadIdx.x; i < min(n, (chunk + 1) * kChunk); i += kThreads) {
    float v[TT];
#pragma unroll
    for (int u = 0; u < TT; ++u) {
      v[u] = t0 + u < tokens ? p.x[(t0 + u) * n + i] : 0.f;
      acc[u][R] += v[u] * v[u];
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const float f = p.fn[r * n + i];
#pragma unroll
      for (int u = 0; u < TT; ++u) acc[u][r] += v[u] * f;
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

// One CTA per token: the partials summed in chunk order, then (warp 0) the
// sigmoid gates and Sinkhorn, then all threads collapse the streams.
template <int HC, bool HEAD>
__global__ void __launch_bounds__(kThreads) hc_mix_finish_kernel(const HcKParams p, int64_t nch, const float* part) {
  constexpr int R = HEAD ? HC : (2 + HC) * HC;
  cuda::dev::pdl_wait_and_release();
  __shared__ float mix[R + 1];
  __shared__ float pre[HC];
  __shared__ float cm[HC * HC];
  const int64_t t = blockIdx.x, n = HC * p.dim;
  const float* x = p.x + t * n;
  if (threadIdx.x <= R) {
    float s = 0.f;
    for (int64_t c = 0; c < nch; ++c) s += part[(t * nch + c) * (R + 1) + threadIdx.x];
    mix[threadIdx.x] = s;
  }
  __syncthreads();
  if (threadIdx.x < 32) {  // warp 0: the gates, then Sinkhorn with a thread per row / column
    const float inv = 1.0f / sqrtf(mix[R] / float(n) + p.norm_eps);
    const int k = threadIdx.x;
    if (k < HC) pre[k] = sigmoid(mix[k] * inv * p.scale[0] + p.base[k]) + p.hc_eps;
    if constexpr (!HEAD) {
      if (k < HC) p.post[t * HC + k] = 2.0f * sigmoid(mix[HC + k] * inv * p.scale[1] + p.base[HC + k]);
      for (int i = k; i < HC * HC; i += 32) cm[i] = mix[2 * HC + i] * inv * p.scale[2] + p.base[2 * HC + i];
      __syncwarp();
      sinkhorn_warp<HC>(cm, p.iters, p.hc_eps);
      for (int i = k; i < HC * HC; i += 32) p.comb[t * HC * HC + i] = cm[i];
    }
  }
  __syncthreads();
  float pk[HC];
#pragma unroll
  for (int k = 0; k < HC; ++k) pk[k] = pre[k];
  for (int64_t d = threadIdx.x; d < p.dim; d += kThreads) {
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < HC; ++k) s += pk[k] * x[k * p.dim + d];
    p.collapsed[t * p.dim + d] = s;
  }
}

template <int HC>
__global__ void hc_post_kernel(int64_t dim, const float* out, const float* post, const float* comb, int64_t tokens,
                               float* x) {
  cuda::dev::pdl_wait_and_release();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= tokens * dim) return;
  const int64_t t = i / dim, d = i % dim;
  float* xt = x + t * HC * dim;
  float old[HC];
#pragma unroll
  for (int j = 0; j < HC; ++j) old[j] = xt[j * dim + d];
  const float o = out[t * dim + d];
  const float* c = comb + t * HC * HC;
#pragma unroll
  for (int k = 0; k < HC; ++k) {
    float s = post[t * HC + k] * o;
#pragma unroll
    for (int j = 0; j < HC; ++j) s += c[j * HC + k] * old[j];
    xt[k * dim + d] = s;
  }
}

template <int HC, bool HEAD>
void launch_mix_hc(cuda::Context& ctx, const HcKParams& p, int64_t tokens, float* part) {
  const int64_t nch = n_chunks(HC, p.dim);
  const dim3 block{unsigned(kThreads)};
  if (tokens == 1)
    cuda::launch_kernel(ctx, hc_mix_partial_kernel<HC, HEAD, 1>, dim3(unsigned(nch), 1u), block, 0,
                        "hc_mix_partial_kernel", p, tokens, part);
  else
    cuda::launch_kernel(ctx, hc_mix_partial_kernel<HC, HEAD, kTileT>,
                        dim3(unsigned(nch), unsigned((tokens + kTileT - 1) / kTileT)), block, 0,
                        "hc_mix_partial_kernel", p, tokens, part);
  cuda::launch_kernel(ctx, hc_mix_finish_kernel<HC, HEAD>, dim3(unsigned(tokens)), block, 0, "hc_mix_finish_kernel", p,
                      nch, static_cast<const float*>(part));
}

template <bool HEAD>
void launch_mix(cuda::Context& ctx, int64_t hc, const HcKParams& p, int64_t tokens, float* part) {
  CM_CU_CHECK(part, "hc: no scratch for the partial sums (hc_mix_scratch_floats)");
  CM_CU_CHECK((tokens + kTileT - 1) / kTileT < 65536, "hc: %lld tokens exceed the grid", (long long)tokens);
  switch (hc) {
    case 1: launch_mix_hc<1, HEAD>(ctx, p, tokens, part); break;
    case 2: launch_mix_hc<2, HEAD>(ctx, p, tokens, part); break;
    case 3: launch_mix_hc<3, HEAD>(ctx, p, tokens, part); break;
    default: launch_mix_hc<4, HEAD>(ctx, p, tokens, part); break;
  }
}

void check_hc(const char* what, int64_t hc, int64_t dim, int64_t tokens) {
  CM_CU_CHECK(hc >= 1 && hc <= 4, "%s: hc_mult %lld unsupported on the GPU (1..4)", what, (long long)hc);
  CM_CU_CHECK(dim > 0 && tokens < (int64_t(1) << 31), "%s: bad shape (dim %lld, %lld tokens)", what, (long long)dim,
              (long long)tokens);
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
  check_hc("hc_post_cuda", hc, dim, tokens);
  if (tokens <= 0) return;
  const int64_t n = tokens * dim;
  const dim3 grid{unsigned((n + 255) / 256)}, block{256u};
  switch (hc) {
    case 1: cuda::launch_kernel(ctx, hc_post_kernel<1>, grid, block, 0, "hc_post_kernel", dim, out, post, comb, tokens, x); break;
    case 2: cuda::launch_kernel(ctx, hc_post_kernel<2>, grid, block, 0, "hc_post_kernel", dim, out, post, comb, tokens, x); break;
    case 3: cuda::launch_kernel(ctx, hc_post_kernel<3>, grid, block, 0, "hc_post_kernel", dim, out, post, comb, tokens, x); break;
    default: cuda::launch_kernel(ctx, hc_post_kernel<4>, grid, block, 0, "hc_post_kernel", dim, out, post, comb, tokens, x); break;
  }
}

}  // namespace cm
