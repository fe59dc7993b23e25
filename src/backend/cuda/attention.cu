// Attention with sinks on the GPU (see ops/attention.h).
// One CTA per query token holds all heads: q [heads, dim] bf16 in shared
// memory; candidate entries (window rows from this step or the slot's ring,
// then compressed entries: all causal ones, or the indexer's choice) stream
// through shared memory in tiles of kTile, each loaded once for every head
// (MQA: K = V). Per tile: warp-level dot products give the scores, one thread
// per head does the online-softmax update (max, rescale, sum; initialised
// with the sink: m = sink, l = 1), and each thread accumulates 8 contiguous
// output channels of heads/HG heads in registers. The end divides by l,
// applies the inverse RoPE at the query position and writes bf16.
// Everything is fixed-order (no atomics): the same inputs give the same bits.
#include <algorithm>

#include "backend/cuda/cuda_util.h"
#include "backend/cuda/kernel_setup.h"
#include "backend/cuda/ops_device.cuh"
#include "ops/attention.h"
#include "ops/rope.h"

namespace cm {

namespace {

constexpr int kTile = 16;
constexpr int kMaxHp = 16;  // heads per thread
constexpr int kMaxDim = 512;
constexpr size_t kMaxSmem = 200 * 1024;

struct AttnParams {
  AttnInputs in;
  const uint16_t* q;
  int heads, dim;
  float scale;
  const float* freqs;
  int rope_dim;
  float af;
  const int32_t* slot;
  const int32_t* pos;
  int64_t n;
  uint16_t* out;
  int hg, hp;  // head groups (threads per dim chunk), heads per thread
  int total_heads;  // heads is the CTA's share (all of them unless heads·dim > 32768)
};

size_t attn_smem(int64_t heads, int64_t dim) {
  return size_t(heads * dim) * 2 + size_t(kTile * dim) * 2 + size_t(heads * kTile) * 4 + size_t(3 * heads) * 4 +
         kTile * 8;
}

__device__ __forceinline__ void unpack8(const uint4& u, float (&f)[8]) {
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    f[2 * k] = __uint_as_float(w[k] << 16);
    f[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
  }
}

__global__ void __launch_bounds__(256) attention_kernel(const AttnParams p) {
  cuda::dev::pdl_wait_and_release();
  extern __shared__ __align__(16) unsigned char smem[];
  const int H = p.heads, D = p.dim, DT = D / 8;
  uint16_t* qs = reinterpret_cast<uint16_t*>(smem);
  uint16_t* tile = qs + H * D;  // offsets stay multiples of 16 bytes (D % 8 == 0)
  const uint16_t** src = reinterpret_cast<const uint16_t**>(tile + kTile * D);
  float* S = reinterpret_cast<float*>(src + kTile);
  float* mh = S + H * kTile;
  float* lh = mh + H;
  float* alpha = lh + H;

  const int64_t i = blockIdx.x;
  const int h0 = blockIdx.y * H;  // this CTA's heads: [h0, h0 + H) of p.total_heads
  const int64_t P = p.pos[i], s = p.slot[i];
  const AttnInputs& in = p.in;
  const int64_t n_win = min(P + 1, in.W);
  int64_t n_comp = 0;
  if (in.entries && in.ratio > 0) n_comp = in.sel ? in.topk : min((P + 1) / in.ratio, in.max_entries);
  const int64_t total = n_win + n_comp;

  {
    const uint4* qg = reinterpret_cast<const uint4*>(p.q + (i * p.total_heads + h0) * D);
    uint4* q4 = reinterpret_cast<uint4*>(qs);
    for (int k = threadIdx.x; k < H * DT; k += blockDim.x) q4[k] = qg[k];
  }
  for (int h = threadIdx.x; h < H; h += blockDim.x) {
    mh[h] = p.in.sinks[h0 + h];
    lh[h] = 1.0f;
  }
  const int c = threadIdx.x % DT, hg = threadIdx.x / DT;
  float o[kMaxHp][8];
#pragma unroll
  for (int a = 0; a < kMaxHp; ++a)
#pragma unroll
    for (int b = 0; b < 8; ++b) o[a][b] = 0.f;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;

  for (int64_t t0 = 0; t0 < total; t0 += kTile) {
    __syncthreads();  // the previous tile is consumed
    if (threadIdx.x < kTile) {
      const int64_t cidx = t0 + threadIdx.x;
      const uint16_t* ptr = nullptr;
      if (cidx < n_win) {
        const int64_t q = P - n_win + 1 + cidx, j = i - (P - q);
        if (j >= 0 && p.slot[j] == s && p.pos[j] == q)
          ptr = in.kv + j * D;
        else
          ptr = in.window + (s * in.W + q % in.W) * D;
      } else if (cidx < total) {
        const int64_t ci = cidx - n_win;
        const int64_t e = in.sel ? int64_t(in.sel[i * in.topk + ci]) : ci;
        if (e >= 0 && e < (P + 1) / in.ratio && e < in.max_entries) ptr = in.entries + (s * in.max_entries + e) * D;
      }
      src[threadIdx.x] = ptr;
    }
    __syncthreads();
    for (int k = threadIdx.x; k < kTile * DT; k += blockDim.x) {
      const int e = k / DT, cc = k % DT;
      const uint16_t* sp = src[e];
      reinterpret_cast<uint4*>(tile)[k] = sp ? reinterpret_cast<const uint4*>(sp)[cc] : make_uint4(0, 0, 0, 0);
    }
    __syncthreads();
    // scores S[h][e] = (q_h · e)·scale, −inf for missing entries
    for (int pr = warp; pr < H * kTile; pr += nwarps) {
      const int h = pr / kTile, e = pr % kTile;
      float acc = 0.f;
      for (int cc = lane; cc < DT; cc += 32) {
        float qa[8], ea[8];
        unpack8(reinterpret_cast<const uint4*>(qs + h * D)[cc], qa);
        unpack8(reinterpret_cast<const uint4*>(tile + e * D)[cc], ea);
#pragma unroll
        for (int b = 0; b < 8; ++b) acc += qa[b] * ea[b];
      }
      acc = cuda::dev::warp_sum(acc);
      if (lane == 0) S[h * kTile + e] = src[e] ? acc * p.scale : -INFINITY;
    }
    __syncthreads();
    for (int h = threadIdx.x; h < H; h += blockDim.x) {
      float mx = mh[h];
      for (int e = 0; e < kTile; ++e) mx = fmaxf(mx, S[h * kTile + e]);
      const float a = expf(mh[h] - mx);
      float l = lh[h] * a;
      for (int e = 0; e < kTile; ++e) {
        const float pe = expf(S[h * kTile + e] - mx);
        S[h * kTile + e] = pe;
        l += pe;
      }
      mh[h] = mx;
      lh[h] = l;
      alpha[h] = a;
    }
    __syncthreads();
#pragma unroll
    for (int hh = 0; hh < kMaxHp; ++hh) {
      const int h = hg * p.hp + hh;
      if (hh < p.hp && h < H) {
        const float a = alpha[h];
#pragma unroll
        for (int b = 0; b < 8; ++b) o[hh][b] *= a;
      }
    }
    for (int e = 0; e < kTile; ++e) {
      float ev[8];
      unpack8(reinterpret_cast<const uint4*>(tile + e * D)[c], ev);
#pragma unroll
      for (int hh = 0; hh < kMaxHp; ++hh) {
        const int h = hg * p.hp + hh;
        if (hh < p.hp && h < H) {
          const float pe = S[h * kTile + e];
#pragma unroll
          for (int b = 0; b < 8; ++b) o[hh][b] += pe * ev[b];
        }
      }
    }
  }
  __syncthreads();
  const int nope = D - p.rope_dim;
#pragma unroll
  for (int hh = 0; hh < kMaxHp; ++hh) {
    const int h = hg * p.hp + hh;
    if (hh < p.hp && h < H) {
      const float inv = 1.0f / lh[h];
      float v[8];
#pragma unroll
      for (int b = 0; b < 8; ++b) v[b] = o[hh][b] * inv;
      if (8 * c >= nope) {
#pragma unroll
        for (int u = 0; u < 4; ++u)
          cuda::dev::rope_pair(v[2 * u], v[2 * u + 1], p.freqs[(8 * c - nope) / 2 + u], P, p.af, true);
      }
      uint32_t w[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) w[u] = uint32_t(cuda::dev::to_bf(v[2 * u])) | (uint32_t(cuda::dev::to_bf(v[2 * u + 1])) << 16);
      reinterpret_cast<uint4*>(p.out + (i * p.total_heads + h0 + h) * D)[c] = make_uint4(w[0], w[1], w[2], w[3]);
    }
  }
}

__global__ void window_store_kernel(const uint16_t* kv, uint16_t* window, int64_t W, int64_t dim, const int32_t* slot,
                                    const int32_t* pos, int64_t n) {
  cuda::dev::pdl_wait_and_release();
  const int64_t i = blockIdx.x, s = slot[i];
  if (i + W < n && slot[i + W] == s) return;  // position p + W of this chunk takes the ring row
  uint16_t* dst = window + (s * W + pos[i] % W) * dim;
  for (int64_t k = threadIdx.x; k < dim; k += blockDim.x) dst[k] = kv[i * dim + k];
}

}  // namespace

void setup_attention_kernels(int /*device*/) {
  CM_CUDA(cudaFuncSetAttribute(attention_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kMaxSmem)));
}

void attention_sink_cuda(cuda::Context& ctx, const AttnInputs& in, const uint16_t* q, int64_t heads, int64_t dim,
                         float scale, const RopeView& rope, const int32_t* slot, const int32_t* pos, int64_t n,
                         uint16_t* out) {
  CM_CU_CHECK(dim >= 8 && dim <= kMaxDim && (dim & (dim - 1)) == 0,
              "attention_sink_cuda: head_dim %lld unsupported (a power of two in [8, %d])", (long long)dim, kMaxDim);
  CM_CU_CHECK(heads > 0, "attention_sink_cuda: no heads");
  CM_CU_CHECK(rope.freqs && rope.rope_dim > 0 && rope.rope_dim % 8 == 0 && rope.rope_dim <= dim,
              "attention_sink_cuda: RoPE of %lld channels (needs a multiple of 8 within the head)",
              (long long)rope.rope_dim);
  CM_CU_CHECK(in.kv && in.window && in.W > 0 && in.sinks, "attention_sink_cuda: missing KV rows, window or sinks");
  CM_CU_CHECK(!in.entries || (in.ratio > 0 && in.max_entries > 0 && (!in.sel || in.topk > 0)),
              "attention_sink_cuda: compressed entries need a ratio, a capacity and (with a selection) its top-k");
  if (n <= 0) return;
  CM_CU_CHECK(n < (int64_t(1) << 31), "attention_sink_cuda: %lld tokens exceed the grid", (long long)n);
  // All heads in one CTA up to heads·dim = 32768 (V4-Flash: 64 × 512); beyond
  // (V4-Pro's 128 heads) the heads split over CTAs of 32768/dim heads each.
  const int64_t cta_heads = std::min<int64_t>(heads, 32768 / dim);
  CM_CU_CHECK(heads % cta_heads == 0, "attention_sink_cuda: %lld heads do not split into CTAs of %lld",
              (long long)heads, (long long)cta_heads);
  const int threads = 256;
  const int dt = int(dim / 8), hg = threads / dt, hp = int((cta_heads + hg - 1) / hg);
  CM_CU_CHECK(hp <= kMaxHp, "attention_sink_cuda: internal: %d heads per thread", hp);
  const size_t smem = attn_smem(cta_heads, dim);
  CM_CU_CHECK(smem <= kMaxSmem, "attention_sink_cuda: %zu bytes of shared memory needed", smem);
  AttnParams p{in, q, int(cta_heads), int(dim), scale, rope.freqs, int(rope.rope_dim), rope.attention_factor, slot,
               pos, n, out, hg, hp, int(heads)};
  cuda::launch_kernel(ctx, attention_kernel, dim3(unsigned(n), unsigned(heads / cta_heads)), dim3(unsigned(threads)),
                      smem, "attention_kernel", p);
}

void window_store_cuda(cuda::Context& ctx, const uint16_t* kv, uint16_t* window, int64_t W, int64_t dim,
                       const int32_t* slot, const int32_t* pos, int64_t n) {
  CM_CU_CHECK(W > 0 && dim > 0 && kv && window, "window_store_cuda: empty window or rows");
  if (n <= 0) return;
  cuda::launch_kernel(ctx, window_store_kernel, dim3(unsigned(n)), dim3(128), 0, "window_store_kernel", kv, window, W,
                      dim, slot, pos, n);
}

}  // namespace cm
