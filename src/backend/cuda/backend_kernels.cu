// Small kernels of the CUDA model backend (see backend_kernels.h). Every
// reduction runs in a fixed order, so the same inputs give the same bits.
#include "backend/cuda/backend_kernels.h"
#include "backend/cuda/cuda_util.h"
#include "backend/cuda/ops_device.cuh"

namespace cm::cuda {

namespace {

using dev::bf;
using dev::pdl_wait_and_release;
using dev::store_out;

__device__ __forceinline__ float load(const void* p, bool is_bf16, int64_t i) {
  return is_bf16 ? bf(static_cast<const uint16_t*>(p)[i]) : static_cast<const float*>(p)[i];
}

unsigned blocks_for(int64_t n, int threads) { return unsigned(std::min<int64_t>((n + threads - 1) / threads, 65535 * 8)); }

__global__ void cast_kernel(const float* x, int64_t ldx, int64_t rows, int64_t cols, uint16_t* y, int64_t ldy) {
  pdl_wait_and_release();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < rows * cols; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    y[r * ldy + c] = dev::to_bf(x[r * ldx + c]);
  }
}

// One warp per output column n and a tile of kDenseRows rows: lanes take k = lane, lane + 32, …,
// each weight value loaded once for the tile's rows, and every (m, n) sums in the same fixed tree
// whatever the tile holds — a row's result does not depend on M (batch invariance). One row per
// warp re-read the whole weight for every row (a 129k x 4096 head at 256 rows: 71 ms).
constexpr int kDenseWarps = 8;
constexpr int kDenseRows = 16;
__global__ void dense_linear_kernel(const void* w, bool w_bf16, int64_t N, int64_t K, int64_t rows_per_group,
                                    const void* x, bool x_bf16, int64_t M, int64_t ldx, void* y, bool y_bf16,
                                    int64_t ldy, float alpha) {
  pdl_wait_and_release();
  const int64_t m0 = int64_t(blockIdx.y) * kDenseRows;
  const int64_t n = int64_t(blockIdx.x) * kDenseWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (n >= N) return;
  const int rows = int(M - m0 < kDenseRows ? M - m0 : kDenseRows);
  const int64_t g = n / rows_per_group;
  const int64_t xo = m0 * ldx + g * K, wo = n * K;
  float acc[kDenseRows];
#pragma unroll
  for (int u = 0; u < kDenseRows; ++u) acc[u] = 0.f;
  for (int64_t k = lane; k < K; k += 32) {
    const float wv = load(w, w_bf16, wo + k);
#pragma unroll
    for (int u = 0; u < kDenseRows; ++u)
      if (u < rows) acc[u] += load(x, x_bf16, xo + u * ldx + k) * wv;
  }
#pragma unroll
  for (int u = 0; u < kDenseRows; ++u) {
    if (u >= rows) break;
    const float v = dev::warp_sum(acc[u]);
    if (lane == 0) store_out(y, y_bf16, (m0 + u) * ldy + n, v * alpha);
  }
}

__global__ void add_kernel(const float* a, const float* b, int64_t n, float* y) {
  pdl_wait_and_release();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = a[i] + b[i];
}

__global__ void scale_kernel(float* x, int64_t n, float s) {
  pdl_wait_and_release();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] *= s;
}

__global__ void replace_nan_kernel(float* x, int64_t n, float v) {
  pdl_wait_and_release();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    if (isnan(x[i])) x[i] = v;
}

__global__ void axpy_rows_kernel(const float* a, const float* x, int64_t T, int64_t D, float* y) {
  pdl_wait_and_release();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < T * D; i += int64_t(gridDim.x) * blockDim.x)
    y[i] += a[i / D] * x[i];
}

__global__ void expert_weights_kernel(const int32_t* ids, const float* w, int64_t T, int64_t topk, int64_t E,
                                      float* we) {
  pdl_wait_and_release();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < E * T; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t e = i / T, t = i % T;
    float v = 0.f;
    for (int64_t k = 0; k < topk; ++k)
      if (ids[t * topk + k] == e) v += w[t * topk + k];
    we[i] = v;
  }
}

__global__ void gather_rows_kernel(const float* x, const int32_t* rows, int64_t width, float* y) {
  pdl_wait_and_release();
  const int64_t r = blockIdx.x, src = rows[r];
  for (int64_t c = threadIdx.x; c < width; c += blockDim.x) y[r * width + c] = x[src * width + c];
}

__global__ void gather_scores_kernel(const float* score, int64_t ld, const int32_t* idx, int64_t T, int64_t topk,
                                     float* out) {
  pdl_wait_and_release();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < T * topk; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / topk;
    const int32_t e = idx[i];
    out[i] = e >= 0 ? score[t * ld + e] : 0.f;
  }
}

__global__ void count_non_finite_kernel(const void* x, bool x_bf16, int64_t width, int32_t* count) {
  pdl_wait_and_release();
  __shared__ float tmp[32];
  const int64_t r = blockIdx.x;
  float bad = 0.f;
  for (int64_t c = threadIdx.x; c < width; c += blockDim.x) bad += isfinite(load(x, x_bf16, r * width + c)) ? 0.f : 1.f;
  bad = dev::block_sum(bad, tmp);
  if (threadIdx.x == 0) count[r] = int32_t(bad);
}

}  // namespace

void cast_f32_bf16(Context& ctx, const float* x, int64_t ldx, int64_t rows, int64_t cols, uint16_t* y, int64_t ldy) {
  if (rows <= 0 || cols <= 0) return;
  launch_kernel(ctx, cast_kernel, dim3(blocks_for(rows * cols, 256)), dim3(256), 0, "cast_kernel", x, ldx, rows, cols,
                y, ldy);
}

void dense_linear(Context& ctx, const void* w, bool w_bf16, int64_t N, int64_t K, int groups, const void* x,
                  bool x_bf16, int64_t M, int64_t ldx, void* y, bool y_bf16, int64_t ldy, float alpha) {
  if (M <= 0) return;
  CM_CU_CHECK(groups >= 1 && N % groups == 0, "dense_linear: %lld rows do not split into %d groups", (long long)N,
              groups);
  CM_CU_CHECK(M < int64_t(65536) * kDenseRows, "dense_linear: %lld rows exceed the grid", (long long)M);
  const dim3 grid(unsigned((N + kDenseWarps - 1) / kDenseWarps), unsigned((M + kDenseRows - 1) / kDenseRows));
  launch_kernel(ctx, dense_linear_kernel, grid, dim3(32 * kDenseWarps), 0, "dense_linear_kernel", w, w_bf16, N, K,
                N / groups, x, x_bf16, M, ldx, y, y_bf16, ldy, alpha);
}

void add_f32(Context& ctx, const float* a, const float* b, int64_t n, float* y) {
  if (n <= 0) return;
  launch_kernel(ctx, add_kernel, dim3(blocks_for(n, 256)), dim3(256), 0, "add_kernel", a, b, n, y);
}

void scale_f32(Context& ctx, float* x, int64_t n, float s) {
  if (n <= 0) return;
  launch_kernel(ctx, scale_kernel, dim3(blocks_for(n, 256)), dim3(256), 0, "scale_kernel", x, n, s);
}

void replace_nan(Context& ctx, float* x, int64_t n, float v) {
  if (n <= 0) return;
  launch_kernel(ctx, replace_nan_kernel, dim3(blocks_for(n, 256)), dim3(256), 0, "replace_nan_kernel", x, n, v);
}

void axpy_rows(Context& ctx, const float* a, const float* x, int64_t T, int64_t D, float* y) {
  if (T * D <= 0) return;
  launch_kernel(ctx, axpy_rows_kernel, dim3(blocks_for(T * D, 256)), dim3(256), 0, "axpy_rows_kernel", a, x, T, D, y);
}

void moe_expert_weights(Context& ctx, const int32_t* ids, const float* w, int64_t T, int64_t topk, int64_t E,
                        float* we) {
  if (T * E <= 0) return;
  launch_kernel(ctx, expert_weights_kernel, dim3(blocks_for(T * E, 256)), dim3(256), 0, "expert_weights_kernel", ids,
                w, T, topk, E, we);
}

void gather_rows(Context& ctx, const float* x, const int32_t* rows, int64_t R, int64_t width, float* y) {
  if (R <= 0) return;
  launch_kernel(ctx, gather_rows_kernel, dim3(unsigned(R)), dim3(256), 0, "gather_rows_kernel", x, rows, width, y);
}

void gather_scores(Context& ctx, const float* score, int64_t ld, const int32_t* idx, int64_t T, int64_t topk,
                   float* out) {
  if (T * topk <= 0) return;
  launch_kernel(ctx, gather_scores_kernel, dim3(blocks_for(T * topk, 256)), dim3(256), 0, "gather_scores_kernel",
                score, ld, idx, T, topk, out);
}

void count_non_finite(Context& ctx, const void* x, bool x_bf16, int64_t rows, int64_t width, int32_t* count) {
  if (rows <= 0) return;
  launch_kernel(ctx, count_non_finite_kernel, dim3(unsigned(rows)), dim3(256), 0, "count_non_finite_kernel", x,
                x_bf16, width, count);
}

}  // namespace cm::cuda
