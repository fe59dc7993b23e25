// mHC on the GPU (see ops/hc.h), all fp32.
// hc_pre / hc_head: one CTA per token. Each thread accumulates, over its
// slice of the flattened hc·D vector, the sum of squares and all (2+hc)·hc
// (head: hc) dot products with fn; the block reduces them in a fixed order.
// One thread then applies sigmoid and the Sinkhorn normalisation (a 4×4
// matrix: latency, not throughput), and all threads collapse the streams.
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

// Same order of operations as hc_sinkhorn (backend/cpu/hc.cpp).
template <int HC>
__device__ void sinkhorn(float* c, int iters, float eps) {
  for (int j = 0; j < HC; ++j) {
    float* row = c + j * HC;
    float m = row[0];
    for (int k = 1; k < HC; ++k) m = fmaxf(m, row[k]);
    float s = 0;
    for (int k = 0; k < HC; ++k) s += (row[k] = expf(row[k] - m));
    for (int k = 0; k < HC; ++k) row[k] = row[k] / s + eps;
  }
  for (int it = 0; it < iters; ++it) {
    if (it > 0)
      for (int j = 0; j < HC; ++j) {
        float s = 0;
        for (int k = 0; k < HC; ++k) s += c[j * HC + k];
        for (int k = 0; k < HC; ++k) c[j * HC + k] /= (s + eps);
      }
    for (int k = 0; k < HC; ++k) {
      float s = 0;
      for (int j = 0; j < HC; ++j) s += c[j * HC + k];
      for (int j = 0; j < HC; ++j) c[j * HC + k] /= (s + eps);
    }
  }
}

// HEAD: hc rows (pre only); else (2+hc)·hc rows (pre, post, comb).
template <int HC, bool HEAD>
__global__ void __launch_bounds__(kThreads) hc_mix_kernel(const HcKParams p) {
  constexpr int R = HEAD ? HC : (2 + HC) * HC;
  cuda::dev::pdl_wait_and_release();
  __shared__ float red[kThreads / 32][R + 1];
  __shared__ float mix[R + 1];
  __shared__ float pre[HC];
  const int64_t t = blockIdx.x, n = HC * p.dim;
  const float* x = p.x + t * n;
  float acc[R + 1];
#pragma unroll
  for (int r = 0; r <= R; ++r) acc[r] = 0.f;
  for (int64_t i = threadIdx.x; i < n; i += kThreads) {
    const float v = x[i];
    acc[R] += v * v;
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] += v * p.fn[r * n + i];
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int r = 0; r <= R; ++r) {
    const float s = cuda::dev::warp_sum(acc[r]);
    if (lane == 0) red[warp][r] = s;
  }
  __syncthreads();
  if (threadIdx.x <= R) {
    float s = 0.f;
    for (int w = 0; w < kThreads / 32; ++w) s += red[w][threadIdx.x];
    mix[threadIdx.x] = s;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    const float inv = 1.0f / sqrtf(mix[R] / float(n) + p.norm_eps);
    for (int k = 0; k < HC; ++k) pre[k] = sigmoid(mix[k] * inv * p.scale[0] + p.base[k]) + p.hc_eps;
    if constexpr (!HEAD) {
      for (int k = 0; k < HC; ++k)
        p.post[t * HC + k] = 2.0f * sigmoid(mix[HC + k] * inv * p.scale[1] + p.base[HC + k]);
      float c[HC * HC];
      for (int i = 0; i < HC * HC; ++i) c[i] = mix[2 * HC + i] * inv * p.scale[2] + p.base[2 * HC + i];
      sinkhorn<HC>(c, p.iters, p.hc_eps);
      for (int i = 0; i < HC * HC; ++i) p.comb[t * HC * HC + i] = c[i];
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

template <bool HEAD>
void launch_mix(cuda::Context& ctx, int64_t hc, const HcKParams& p, int64_t tokens) {
  const dim3 grid{unsigned(tokens)}, block{unsigned(kThreads)};
  switch (hc) {
    case 1: cuda::launch_kernel(ctx, hc_mix_kernel<1, HEAD>, grid, block, 0, "hc_mix_kernel", p); break;
    case 2: cuda::launch_kernel(ctx, hc_mix_kernel<2, HEAD>, grid, block, 0, "hc_mix_kernel", p); break;
    case 3: cuda::launch_kernel(ctx, hc_mix_kernel<3, HEAD>, grid, block, 0, "hc_mix_kernel", p); break;
    default: cuda::launch_kernel(ctx, hc_mix_kernel<4, HEAD>, grid, block, 0, "hc_mix_kernel", p); break;
  }
}

void check_hc(const char* what, int64_t hc, int64_t dim, int64_t tokens) {
  CM_CU_CHECK(hc >= 1 && hc <= 4, "%s: hc_mult %lld unsupported on the GPU (1..4)", what, (long long)hc);
  CM_CU_CHECK(dim > 0 && tokens < (int64_t(1) << 31), "%s: bad shape (dim %lld, %lld tokens)", what, (long long)dim,
              (long long)tokens);
}

}  // namespace

void hc_pre_cuda(cuda::Context& ctx, const HcParams& p, const float* x, int64_t tokens, float* collapsed, float* post,
                 float* comb) {
  check_hc("hc_pre_cuda", p.hc, p.dim, tokens);
  CM_CU_CHECK(p.sinkhorn_iters >= 1, "hc_pre_cuda: sinkhorn_iters must be >= 1");
  if (tokens <= 0) return;
  HcKParams k{p.fn, p.base, p.scale, p.dim, int(p.sinkhorn_iters), p.hc_eps, p.norm_eps, x, collapsed, post, comb};
  launch_mix<false>(ctx, p.hc, k, tokens);
}

void hc_head_cuda(cuda::Context& ctx, const HcHeadParams& p, const float* x, int64_t tokens, float* y) {
  check_hc("hc_head_cuda", p.hc, p.dim, tokens);
  if (tokens <= 0) return;
  HcKParams k{p.fn, p.base, p.scale, p.dim, 0, p.hc_eps, p.norm_eps, x, y, nullptr, nullptr};
  launch_mix<true>(ctx, p.hc, k, tokens);
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
