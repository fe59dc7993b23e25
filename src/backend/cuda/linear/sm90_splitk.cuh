// Epilogue shared by the decode kernels that split K across CTAs (one CTA of
// 128 threads per 16-row block and K range, tile reduced by reduce_warps in
// sm90_nvfp4.cuh): the deterministic last-arriver combination of the partial
// tiles and the store of a 16-row x 8*MT-token tile (NVFP4/MXFP4 and FP8).
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

namespace cm::cuda::sm90 {

// With ksplit > 1: stores this CTA's partial tile; the last CTA to arrive for
// row block rb sums all partials in split order (the same order on every run)
// into vals and resets the counter for the next launch. Returns false for the
// CTAs that are not last (they are done). vals[q] holds tile value threadIdx.x + 128 q.
template <int MT>
__device__ __forceinline__ bool splitk_combine(float (&vals)[MT], float* partials, unsigned* counters, int ksplit,
                                               int split, int row_blocks, int rb) {
  if (ksplit <= 1) return true;
  float* part = partials + (int64_t(split) * row_blocks + rb) * (128 * MT);
#pragma unroll
  for (int i = 0; i < MT; ++i) part[threadIdx.x + 128 * i] = vals[i];
  __threadfence();
  __syncthreads();
  __shared__ unsigned is_last;
  if (threadIdx.x == 0) is_last = atomicAdd(&counters[rb], 1u) == unsigned(ksplit - 1);
  __syncthreads();
  if (!is_last) return false;
  __threadfence();
#pragma unroll
  for (int i = 0; i < MT; ++i) {
    float s = 0.f;
    for (int sp = 0; sp < ksplit; ++sp)
      s += __ldcg(partials + (int64_t(sp) * row_blocks + rb) * (128 * MT) + threadIdx.x + 128 * i);
    vals[i] = s;
  }
  if (threadIdx.x == 0) counters[rb] = 0;
  return true;
}

// The pair decode kernels (two linears in one grid, linear_host.cuh): CTA i < ra·ka runs linear a's
// row block i mod ra and split i / ra, as a's own grid (ra, ka) would; the rest linear b's likewise.
// Returns whether the CTA belongs to a.
__device__ __forceinline__ bool pair_cta(int ra, int ka, int rbb, int& rb, int& split) {
  const int na = ra * ka, i = blockIdx.x;
  const bool first = i < na;
  const int j = first ? i : i - na, rows = first ? ra : rbb;
  rb = j % rows;
  split = j / rows;
  return first;
}

// Writes out[tok, n] = vals * mul for the tile's tokens < M and rows < N
// (value v = tid + 128 q is token v / 16, row rb*16 + v % 16; tid: the
// thread's index in its 128-thread group, threadIdx.x for the decode kernels).
template <int MT>
__device__ __forceinline__ void store_tile_group(const float (&vals)[MT], int tid, int rb, int M, int N, void* y,
                                                 int64_t ldy, bool y_bf16, float mul) {
#pragma unroll
  for (int i = 0; i < MT; ++i) {
    const int v = tid + 128 * i;
    const int tok = v / 16, n = rb * 16 + v % 16;
    if (tok < M && n < N) {
      const float out = vals[i] * mul;
      if (y_bf16)
        static_cast<__nv_bfloat16*>(y)[int64_t(tok) * ldy + n] = __float2bfloat16_rn(out);
      else
        static_cast<float*>(y)[int64_t(tok) * ldy + n] = out;
    }
  }
}

template <int MT>
__device__ __forceinline__ void store_tile(const float (&vals)[MT], int rb, int M, int N, void* y, int64_t ldy,
                                           bool y_bf16, float mul) {
  store_tile_group<MT>(vals, int(threadIdx.x), rb, M, N, y, ldy, y_bf16, mul);
}

}  // namespace cm::cuda::sm90
