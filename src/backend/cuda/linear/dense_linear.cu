// Stored-format row lookups and dense BF16/F32 linears on the GPU (see
// ops/linear.h): the embedding gather (one CTA per token, the expanded row
// written to every hyper-connection stream) and cuBLAS GEMMs with fp32
// compute for the weights that are not quantised.
#include <cublas_v2.h>

#include "backend/cuda/core/cuda_util.h"
#include "backend/cuda/core/ops_device.cuh"
#include "ops/linear.h"

namespace cm {

namespace {

__device__ __forceinline__ float e2m1(uint32_t code) {
  const float mag[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
  const float v = mag[code & 7];
  return (code & 8) ? -v : v;
}

// Same decoding as e4m3_to_f32 (common/numeric.h): bias 7, 0x7F/0xFF NaN.
__device__ __forceinline__ float e4m3(uint32_t v) {
  const uint32_t s = v >> 7, e = (v >> 3) & 0xf, m = v & 7;
  if (e == 15 && m == 7) return __int_as_float(0x7fc00000);
  const float r = e == 0 ? ldexpf(float(m), -9) : ldexpf(1.0f + float(m) / 8.0f, int(e) - 7);
  return s ? -r : r;
}

__global__ void embed_kernel(int format, const void* data, const void* scale, float scale_2, int64_t rows,
                             int64_t dim, const int32_t* tokens, int64_t hc, float* x) {
  cuda::dev::pdl_wait_and_release();
  const int64_t t = blockIdx.x;
  const int32_t tok = tokens[t];
  const bool ok = tok >= 0 && tok < rows;
  float* xt = x + t * hc * dim;
  for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) {
    float v = __int_as_float(0x7fc00000);
    if (ok) {
      const int64_t i = int64_t(tok) * dim + d;
      if (format == int(WeightFormat::F32)) {
        v = static_cast<const float*>(data)[i];
      } else if (format == int(WeightFormat::BF16)) {
        v = cuda::dev::bf(static_cast<const uint16_t*>(data)[i]);
      } else {  // NVFP4: e2m1 * (e4m3 * scale_2), the CPU's order
        const uint8_t byte = static_cast<const uint8_t*>(data)[i / 2];
        const float sc = e4m3(static_cast<const uint8_t*>(scale)[i / 16]) * scale_2;
        v = e2m1((d & 1) ? byte >> 4 : byte & 0xf) * sc;
      }
    }
    for (int64_t k = 0; k < hc; ++k) xt[k * dim + d] = v;
  }
}

}  // namespace

void embed_rows_cuda(cuda::Context& ctx, const DeviceWeightView& w, const int32_t* tokens, int64_t n, int64_t hc,
                     float* x) {
  CM_CU_CHECK(w.format == WeightFormat::F32 || w.format == WeightFormat::BF16 || w.format == WeightFormat::NVFP4,
              "embed_rows_cuda: embedding format %s is not supported on the GPU (F32, BF16, NVFP4)",
              weight_format_name(w.format));
  CM_CU_CHECK(w.data && w.rows > 0 && w.cols > 0 && hc > 0, "embed_rows_cuda: empty embedding or hc_mult");
  CM_CU_CHECK(w.format != WeightFormat::NVFP4 || (w.cols % 16 == 0 && w.scale),
              "embed_rows_cuda: NVFP4 embedding needs a width divisible by 16 and block scales");
  if (n <= 0) return;
  cuda::launch_kernel(ctx, embed_kernel, dim3(unsigned(n)), dim3(256), 0, "embed_kernel", int(w.format), w.data,
                      w.scale, w.scale_2, w.rows, w.cols, tokens, hc, x);
}

void linear_dense_cuda(cuda::Context& ctx, const DeviceWeightView& w, const void* x, bool x_bf16, int64_t m,
                       int64_t ldx, void* y, bool y_bf16, int64_t ldy, float alpha) {
  const bool wbf = w.format == WeightFormat::BF16;
  CM_CU_CHECK(wbf || w.format == WeightFormat::F32, "linear_dense_cuda: weight format %s is not BF16/F32",
              weight_format_name(w.format));
  CM_CU_CHECK(x_bf16 == wbf, "linear_dense_cuda: a %s weight needs %s activations", weight_format_name(w.format),
              wbf ? "bf16" : "f32");
  CM_CU_CHECK(wbf || !y_bf16, "linear_dense_cuda: an F32 weight writes f32 output");
  CM_CU_CHECK(w.rows > 0 && w.cols > 0 && w.rows < (int64_t(1) << 31) && w.cols < (int64_t(1) << 31) &&
                  ldx >= w.cols && ldy >= w.rows,
              "linear_dense_cuda: bad shape (N %lld, K %lld, ldx %lld, ldy %lld)", (long long)w.rows,
              (long long)w.cols, (long long)ldx, (long long)ldy);
  if (m <= 0) return;
  auto h = static_cast<cublasHandle_t>(ctx.cublas());
  const float beta = 0.f;
  const cudaDataType_t it = wbf ? CUDA_R_16BF : CUDA_R_32F, ot = y_bf16 ? CUDA_R_16BF : CUDA_R_32F;
  cuda::check_cublas(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, int(w.rows), int(m), int(w.cols), &alpha, w.data, it,
                                  int(w.cols), x, it, int(ldx), &beta, y, ot, int(ldy), CUBLAS_COMPUTE_32F,
                                  CUBLAS_GEMM_DEFAULT),
                     "cublasGemmEx (linear_dense_cuda)");
}

}  // namespace cm
