// RMSNorm on the GPU (see ops/norm.h): one CTA per row; the sum of squares is
// a fixed-order block reduction; the normed row is staged in shared memory so
// the optional RoPE can read both members of a pair. An f32 output can come
// with its bf16 copy (the input of the FP8/NVFP4 linears that read the row), so
// the row is cast once, here, instead of once per linear.
#include "backend/cuda/core/cuda_util.h"
#include "backend/cuda/norm/norm_device.cuh"
#include "backend/cuda/core/ops_device.cuh"
#include "ops/norm.h"
#include "ops/rope.h"

namespace cm {

namespace {

constexpr int64_t kMaxDim = 12288;

struct NormParams {
  const float* x;
  const float* w;
  int64_t dim;
  float eps;
  void* y;
  int y_bf16;
  uint16_t* copy;      // null: no bf16 copy of an f32 y
  const float* freqs;  // null: no RoPE
  int rope_dim;
  float af;
  const int32_t* pos;
  int64_t rows_per_pos;
};

// Row r of p (one CTA; the row staged in dynamic shared memory).
__device__ __forceinline__ void norm_row(const NormParams& p, const int64_t r) {
  extern __shared__ float row[];
  __shared__ float tmp[32];
  const float* x = p.x + r * p.dim;
  float ss = 0.f;
  for (int64_t i = threadIdx.x; i < p.dim; i += blockDim.x) {
    const float v = x[i];
    row[i] = v;
    ss += v * v;
  }
  cuda::dev::rms_norm_row(row, ss, p.w, p.dim, p.eps, tmp);
  const int64_t nope = p.freqs ? p.dim - p.rope_dim : p.dim;
  for (int64_t i = threadIdx.x; i < nope; i += blockDim.x)
    cuda::dev::store_normed(p.y, p.y_bf16, p.copy, r * p.dim + i, row[i]);
  if (p.freqs) {
    const int64_t pos = p.pos[r / p.rows_per_pos];
    for (int i = threadIdx.x; i < p.rope_dim / 2; i += blockDim.x) {
      float a = row[nope + 2 * i], b = row[nope + 2 * i + 1];
      cuda::dev::rope_pair(a, b, p.freqs[i], pos, p.af, false);
      cuda::dev::store_normed(p.y, p.y_bf16, p.copy, r * p.dim + nope + 2 * i, a);
      cuda::dev::store_normed(p.y, p.y_bf16, p.copy, r * p.dim + nope + 2 * i + 1, b);
    }
  }
}

__global__ void rms_norm_kernel(const NormParams p) {
  cuda::dev::pdl_wait_and_release();
  norm_row(p, blockIdx.x);
}

// Two calls of one row length in one launch: CTAs [0, rows_a) run a's rows, the rest b's.
__global__ void rms_norm2_kernel(const NormParams a, int64_t rows_a, const NormParams b) {
  cuda::dev::pdl_wait_and_release();
  const int64_t r = blockIdx.x;
  if (r < rows_a)
    norm_row(a, r);
  else
    norm_row(b, r - rows_a);
}

NormParams norm_params(const char* what, const RmsNormJob& j) {
  CM_CU_CHECK(j.dim > 0 && j.dim <= kMaxDim, "%s: row length %lld outside [1, %lld]", what, (long long)j.dim,
              (long long)kMaxDim);
  CM_CU_CHECK(!(j.y_bf16 && static_cast<const void*>(j.x) == j.y), "%s: a bf16 output cannot overwrite its f32 input",
              what);
  CM_CU_CHECK(!(j.y_bf16 && j.y_copy_bf16), "%s: a bf16 copy is made of an f32 output only", what);
  CM_CU_CHECK(!j.y_copy_bf16 ||
                  (static_cast<const void*>(j.y_copy_bf16) != j.x && static_cast<void*>(j.y_copy_bf16) != j.y),
              "%s: the bf16 copy cannot overwrite the input or the f32 output", what);
  const RopeView* rope = j.rope;
  if (rope)
    CM_CU_CHECK(rope->freqs && rope->rope_dim > 0 && rope->rope_dim % 2 == 0 && rope->rope_dim <= j.dim && j.pos &&
                    j.rows_per_pos > 0,
                "%s: RoPE of %lld channels on rows of %lld needs a table, positions and rows_per_pos > 0", what,
                (long long)rope->rope_dim, (long long)j.dim);
  CM_CU_CHECK(j.rows < (int64_t(1) << 31), "%s: %lld rows exceed the grid", what, (long long)j.rows);
  return NormParams{j.x, j.w, j.dim, j.eps, j.y, j.y_bf16, j.y_copy_bf16, rope ? rope->freqs : nullptr,
                    rope ? int(rope->rope_dim) : 0, rope ? rope->attention_factor : 1.0f, j.pos, j.rows_per_pos};
}

}  // namespace

void rms_norm_cuda(cuda::Context& ctx, const float* x, const float* w, int64_t rows, int64_t dim, float eps, void* y,
                   bool y_bf16, const RopeView* rope, const int32_t* pos, int64_t rows_per_pos, uint16_t* y_copy_bf16) {
  const NormParams p =
      norm_params("rms_norm_cuda", RmsNormJob{x, w, rows, dim, eps, y, y_bf16, rope, pos, rows_per_pos, y_copy_bf16});
  if (rows <= 0) return;
  cuda::launch_kernel(ctx, rms_norm_kernel, dim3(unsigned(rows)), dim3(unsigned(cuda::rms_norm_threads(dim))),
                      size_t(dim) * 4, "rms_norm_kernel", p);
}

void rms_norm2_cuda(cuda::Context& ctx, const RmsNormJob& a, const RmsNormJob& b) {
  const NormParams pa = norm_params("rms_norm2_cuda", a), pb = norm_params("rms_norm2_cuda", b);
  CM_CU_CHECK(a.dim == b.dim, "rms_norm2_cuda: rows of %lld and %lld values (one launch takes one length)",
              (long long)a.dim, (long long)b.dim);
  const int64_t rows = std::max<int64_t>(a.rows, 0) + std::max<int64_t>(b.rows, 0);
  if (rows <= 0) return;
  CM_CU_CHECK(rows < (int64_t(1) << 31), "rms_norm2_cuda: %lld rows exceed the grid", (long long)rows);
  cuda::launch_kernel(ctx, rms_norm2_kernel, dim3(unsigned(rows)), dim3(unsigned(cuda::rms_norm_threads(a.dim))),
                      size_t(a.dim) * 4, "rms_norm2_kernel", pa, std::max<int64_t>(a.rows, 0), pb);
}

}  // namespace cm
