// The RMSNorm of one row by one CTA, shared by the RMSNorm kernel (norm.cu) and
// the kernels that fuse it into the producer of the row (the mHC finish kernel,
// hc.cu). Both stage the row in shared memory and sum its squares with the same
// thread → element mapping (element i on thread i mod blockDim, blockDim from
// rms_norm_threads) and the same block reduction, so the fused kernels give the
// RMSNorm kernel's bits.
#pragma once
#include <algorithm>
#include <cstdint>

#include "backend/cuda/core/ops_device.cuh"

namespace cm::cuda {

// Threads of a CTA that normalises a row of dim values (a multiple of 32, at most 1024).
inline int rms_norm_threads(int64_t dim) {
  return int(std::min<int64_t>(1024, std::max<int64_t>(32, (dim / 4 + 31) / 32 * 32)));
}

namespace dev {

// row [dim] in shared memory holds the row; ss is this thread's sum of the squares of its elements
// (i = threadIdx.x, += blockDim.x, in that order). Scales row in place to w ⊙ row / rms (w null:
// unweighted) and synchronises the block. Every thread of the block must call it.
__device__ __forceinline__ void rms_norm_row(float* row, float ss, const float* w, int64_t dim, float eps, float* tmp) {
  ss = block_sum(ss, tmp);
  const float inv = 1.0f / sqrtf(ss / float(dim) + eps);
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    const float v = row[i] * inv;
    row[i] = w ? w[i] * v : v;
  }
  __syncthreads();
}

// Element i of a normed row to y (f32 or bf16) and, when copy is not null, its bf16 copy: the
// rounding of the same f32 value cast_f32_bf16 would make, for the bf16 linears that read the row.
__device__ __forceinline__ void store_normed(void* y, bool y_bf16, uint16_t* copy, int64_t i, float v) {
  store_out(y, y_bf16, i, v);
  if (copy) copy[i] = to_bf(v);
}

}  // namespace dev
}  // namespace cm::cuda
