// Clamped SwiGLU on the GPU (see ops/swiglu.h): one thread per output value,
// the CPU's order of operations.
#include "backend/cuda/core/cuda_util.h"
#include "backend/cuda/core/ops_device.cuh"
#include "ops/swiglu.h"

namespace cm {

namespace {

__global__ void swiglu_kernel(const float* g, const float* u, int64_t ldg, int64_t rows, int64_t cols, float limit,
                              const float* row_weight, void* h, int h_bf16) {
  cuda::dev::pdl_wait_and_release();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * cols) return;
  const int64_t r = i / cols, c = i % cols;
  float gv = g[r * ldg + c], uv = u[r * ldg + c];
  if (limit > 0) {
    gv = fminf(gv, limit);
    uv = fminf(fmaxf(uv, -limit), limit);
  }
  float v = gv / (1.0f + expf(-gv)) * uv;
  if (row_weight) v *= row_weight[r];
  cuda::dev::store_out(h, h_bf16, i, v);
}

}  // namespace

void swiglu_cuda(cuda::Context& ctx, const float* g, const float* u, int64_t ldg, int64_t rows, int64_t cols,
                 float limit, const float* row_weight, void* h, bool h_bf16) {
  CM_CU_CHECK(cols > 0 && ldg >= cols, "swiglu_cuda: rows of %lld values %lld apart", (long long)cols, (long long)ldg);
  if (rows <= 0) return;
  const int64_t n = rows * cols;
  CM_CU_CHECK(n / 256 < (int64_t(1) << 31), "swiglu_cuda: %lld values exceed the grid", (long long)n);
  cuda::launch_kernel(ctx, swiglu_kernel, dim3(unsigned((n + 255) / 256)), dim3(256), 0, "swiglu_kernel", g, u, ldg,
                      rows, cols, limit, row_weight, h, int(h_bf16));
}

}  // namespace cm
