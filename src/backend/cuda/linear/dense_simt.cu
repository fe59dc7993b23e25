// The batch-invariant dense (BF16/F32-weight) linear of the model's step (linear.h:
// dense_linear): BF16 weights on tensor cores when the shapes allow it (dense_mma.cu), else this
// SIMT kernel. Every reduction runs in a fixed order, so the same inputs give the same bits.
#include "backend/cuda/core/cuda_util.h"
#include "backend/cuda/core/ops_device.cuh"
#include "backend/cuda/linear/linear.h"

namespace cm::cuda {

namespace {

using dev::bf;
using dev::pdl_wait_and_release;
using dev::store_out;

__device__ __forceinline__ float load(const void* p, bool is_bf16, int64_t i) {
  return is_bf16 ? bf(static_cast<const uint16_t*>(p)[i]) : static_cast<const float*>(p)[i];
}

// Dense (BF16/F32-weight) linear. Every output (m, n) is summed exactly as by one warp alone: lane l
// takes k = l, l + 32, … in ascending order, then a fixed shuffle tree — whatever M and the tiling, so
// a row's result never depends on the other rows (batch invariance). The tiling only shares loads: a
// CTA takes ROWS rows × kDenseWarps·COLS columns of one weight group; the rows' x chunk
// of kDenseK values is staged in shared memory once for all its columns, and each weight value is
// loaded once for all the rows. (One warp per (m, n) re-read the whole weight per row and x per
// column: a 129k × 4096 BF16 head at 256 rows took 71 ms.)
constexpr int kDenseWarps = 8;
constexpr int kDenseK = 256;  // x values per row staged at a time (a multiple of 32)
// COLS columns per warp, ROWS rows per CTA: the launch picks them by M (few rows: many narrow CTAs,
// the weight streamed by many SMs; many rows: wide tiles that share loads) — the per-output sums are
// the same for every choice, so the choice changes no bit.
template <int COLS, int ROWS>
__global__ void __launch_bounds__(32 * kDenseWarps) dense_linear_kernel(const void* w, bool w_bf16, int64_t N, int64_t K,
                                                                       int64_t rows_per_group, const void* x,
                                                                       bool x_bf16, int64_t M, int64_t ldx, void* y,
                                                                       bool y_bf16, int64_t ldy, float alpha) {
  constexpr int kDenseCols = COLS, kDenseRows = ROWS, kDenseCtaCols = kDenseWarps * COLS;
  pdl_wait_and_release();
  __shared__ float xs[kDenseRows][kDenseK];
  const int64_t blocks_per_group = (rows_per_group + kDenseCtaCols - 1) / kDenseCtaCols;
  const int64_t g = blockIdx.x / blocks_per_group;
  const int64_t c0 = (blockIdx.x % blocks_per_group) * kDenseCtaCols;  // first column within the group
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t m0 = int64_t(blockIdx.y) * kDenseRows;
  const int rows = int(M - m0 < kDenseRows ? M - m0 : kDenseRows);
  int64_t n[kDenseCols];
  bool valid[kDenseCols];
#pragma unroll
  for (int c = 0; c < kDenseCols; ++c) {
    const int64_t cg = c0 + warp * kDenseCols + c;
    valid[c] = cg < rows_per_group;
    n[c] = g * rows_per_group + (valid[c] ? cg : 0);
  }
  float acc[kDenseCols][kDenseRows];
#pragma unroll
  for (int c = 0; c < kDenseCols; ++c)
#pragma unroll
    for (int u = 0; u < kDenseRows; ++u) acc[c][u] = 0.f;
  for (int64_t k0 = 0; k0 < K; k0 += kDenseK) {
    const int len = int(K - k0 < kDenseK ? K - k0 : kDenseK);
    __syncthreads();  // the previous chunk is consumed
    for (int i = threadIdx.x; i < rows * kDenseK; i += blockDim.x) {
      const int u = i / kDenseK, kk = i % kDenseK;
      if (kk < len) xs[u][kk] = load(x, x_bf16, (m0 + u) * ldx + g * K + k0 + kk);
    }
    __syncthreads();
    for (int kk = lane; kk < len; kk += 32) {
      float wv[kDenseCols];
#pragma unroll
      for (int c = 0; c < kDenseCols; ++c) wv[c] = valid[c] ? load(w, w_bf16, n[c] * K + k0 + kk) : 0.f;
#pragma unroll
      for (int u = 0; u < kDenseRows; ++u) {
        if (u >= rows) break;
        const float xv = xs[u][kk];
#pragma unroll
        for (int c = 0; c < kDenseCols; ++c) acc[c][u] += xv * wv[c];
      }
    }
  }
#pragma unroll
  for (int c = 0; c < kDenseCols; ++c)
#pragma unroll
    for (int u = 0; u < kDenseRows; ++u) {
      if (u >= rows) break;
      const float v = dev::warp_sum(acc[c][u]);
      if (lane == 0 && valid[c]) store_out(y, y_bf16, (m0 + u) * ldy + n[c], v * alpha);
    }
}

}  // namespace

void dense_linear(Context& ctx, const void* w, bool w_bf16, int64_t N, int64_t K, int groups, const void* x,
                  bool x_bf16, int64_t M, int64_t ldx, void* y, bool y_bf16, int64_t ldy, float alpha) {
  if (M <= 0) return;
  CM_CU_CHECK(groups >= 1 && N % groups == 0, "dense_linear: %lld rows do not split into %d groups", (long long)N,
              groups);
  if (w_bf16 && dense_mma_supported(K, ldx, x, x_bf16)) {
    dense_linear_mma(ctx, static_cast<const uint16_t*>(w), N, K, groups, x, x_bf16, M, ldx, y, y_bf16, ldy, alpha);
    return;
  }
  const auto launch = [&](auto kernel, int cols, int rows) {
    CM_CU_CHECK(M < int64_t(65536) * rows, "dense_linear: %lld rows exceed the grid", (long long)M);
    const int64_t rpg = N / groups, cta_cols = kDenseWarps * cols;
    const int64_t blocks = int64_t(groups) * ((rpg + cta_cols - 1) / cta_cols);
    CM_CU_CHECK(blocks < (int64_t(1) << 31), "dense_linear: %lld columns exceed the grid", (long long)N);
    const dim3 grid(unsigned(blocks), unsigned((M + rows - 1) / rows));
    launch_kernel(ctx, kernel, grid, dim3(32 * kDenseWarps), 0, "dense_linear_kernel", w, w_bf16, N, K, rpg, x, x_bf16,
                  M, ldx, y, y_bf16, ldy, alpha);
  };
  if (M <= 2)
    launch(dense_linear_kernel<1, 2>, 1, 2);
  else if (M <= 8)
    launch(dense_linear_kernel<2, 8>, 2, 8);
  else
    launch(dense_linear_kernel<4, 16>, 4, 16);
}

}  // namespace cm::cuda
