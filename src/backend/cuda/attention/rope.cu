// Interleaved partial RoPE on the GPU (see ops/rope.h): one thread per
// rotated pair; the non-RoPE channels are copied when x and y differ.
#include "backend/cuda/core/cuda_util.h"
#include "backend/cuda/core/ops_device.cuh"
#include "ops/rope.h"

namespace cm {

namespace {

struct RopeParams {
  const void* x;
  void* y;
  int x_bf16, y_bf16;
  int64_t rows, dim, rows_per_pos;
  const int32_t* pos;
  const float* freqs;
  int rope_dim;
  float af;
  int inverse;
};

__device__ __forceinline__ float load_in(const void* x, bool bf16, int64_t i) {
  return bf16 ? cuda::dev::bf(static_cast<const uint16_t*>(x)[i]) : static_cast<const float*>(x)[i];
}

__global__ void rope_kernel(const RopeParams p) {
  cuda::dev::pdl_wait_and_release();
  const int64_t r = blockIdx.x;
  const int64_t nope = p.dim - p.rope_dim;
  const int64_t base = r * p.dim;
  const int64_t pos = p.pos[r / p.rows_per_pos];
  const bool same = p.x == p.y && p.x_bf16 == p.y_bf16;
  if (!same)
    for (int64_t i = threadIdx.x; i < nope; i += blockDim.x)
      cuda::dev::store_out(p.y, p.y_bf16, base + i, load_in(p.x, p.x_bf16, base + i));
  for (int i = threadIdx.x; i < p.rope_dim / 2; i += blockDim.x) {
    float a = load_in(p.x, p.x_bf16, base + nope + 2 * i), b = load_in(p.x, p.x_bf16, base + nope + 2 * i + 1);
    cuda::dev::rope_pair(a, b, p.freqs[i], pos, p.af, p.inverse);
    cuda::dev::store_out(p.y, p.y_bf16, base + nope + 2 * i, a);
    cuda::dev::store_out(p.y, p.y_bf16, base + nope + 2 * i + 1, b);
  }
}

}  // namespace

void rope_cuda(cuda::Context& ctx, const void* x, bool x_bf16, void* y, bool y_bf16, int64_t rows, int64_t dim,
               const int32_t* pos, int64_t rows_per_pos, const RopeView& rope, bool inverse) {
  CM_CU_CHECK(rope.rope_dim > 0 && rope.rope_dim % 2 == 0 && rope.rope_dim <= dim && rope.freqs,
              "rope_cuda: rope_dim %lld does not fit rows of %lld (or no frequency table)", (long long)rope.rope_dim,
              (long long)dim);
  CM_CU_CHECK(rows_per_pos > 0, "rope_cuda: rows_per_pos must be positive");
  CM_CU_CHECK(x != y || x_bf16 == y_bf16, "rope_cuda: in place needs the same dtype in and out");
  if (rows <= 0) return;
  CM_CU_CHECK(rows < (int64_t(1) << 31), "rope_cuda: %lld rows exceed the grid", (long long)rows);
  RopeParams p{x, y, x_bf16, y_bf16, rows, dim, rows_per_pos, pos, rope.freqs, int(rope.rope_dim),
               rope.attention_factor, inverse};
  cuda::launch_kernel(ctx, rope_kernel, dim3(unsigned(rows)), dim3(128), 0, "rope_kernel", p);
}

}  // namespace cm
