// RMSNorm on the GPU (see ops/norm.h): one CTA per row; the sum of squares is
// a fixed-order block reduction; the normed row is staged in shared memory so
// the optional RoPE can read both members of a pair. An f32 output can come
// with its bf16 copy (the input of the FP8/NVFP4 linears that read the row), so
// the row is cast once, here, instead of once per linear.
#include "backend/cuda/cuda_util.h"
#include "backend/cuda/norm_device.cuh"
#include "backend/cuda/ops_device.cuh"
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

__global__ void rms_norm_kernel(const NormParams p) {
  cuda::dev::pdl_wait_and_release();
  extern __shared__ float row[];
  __shared__ float tmp[32];
  const int64_t r = blockIdx.x;
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

}  // namespace

void rms_norm_cuda(cuda::Context& ctx, const float* x, const float* w, int64_t rows, int64_t dim, float eps, void* y,
                   bool y_bf16, const RopeView* rope, const int32_t* pos, int64_t rows_per_pos, uint16_t* y_copy_bf16) {
  CM_CU_CHECK(dim > 0 && dim <= kMaxDim, "rms_norm_cuda: row length %lld outside [1, %lld]", (long long)dim,
              (long long)kMaxDim);
  CM_CU_CHECK(!(y_bf16 && static_cast<const void*>(x) == y), "rms_norm_cuda: a bf16 output cannot overwrite its f32 input");
  CM_CU_CHECK(!(y_bf16 && y_copy_bf16), "rms_norm_cuda: a bf16 copy is made of an f32 output only");
  CM_CU_CHECK(!y_copy_bf16 || (static_cast<const void*>(y_copy_bf16) != x && static_cast<void*>(y_copy_bf16) != y),
              "rms_norm_cuda: the bf16 copy cannot overwrite the input or the f32 output");
  if (rope)
    CM_CU_CHECK(rope->freqs && rope->rope_dim > 0 && rope->rope_dim % 2 == 0 && rope->rope_dim <= dim && pos &&
                    rows_per_pos > 0,
                "rms_norm_cuda: RoPE of %lld channels on rows of %lld needs a table, positions and rows_per_pos > 0",
                (long long)rope->rope_dim, (long long)dim);
  if (rows <= 0) return;
  CM_CU_CHECK(rows < (int64_t(1) << 31), "rms_norm_cuda: %lld rows exceed the grid", (long long)rows);
  NormParams p{x, w, dim, eps, y, y_bf16, y_copy_bf16, rope ? rope->freqs : nullptr, rope ? int(rope->rope_dim) : 0,
               rope ? rope->attention_factor : 1.0f, pos, rows_per_pos};
  cuda::launch_kernel(ctx, rms_norm_kernel, dim3(unsigned(rows)), dim3(unsigned(cuda::rms_norm_threads(dim))), size_t(dim) * 4,
                      "rms_norm_kernel", p);
}

}  // namespace cm
