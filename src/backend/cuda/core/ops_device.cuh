// Device helpers shared by the non-linear op kernels (norm, RoPE, mHC,
// compressor, indexer, attention, router): bf16 <-> fp32 loads and stores,
// fixed-order block reductions (the same bits on every run: no atomics), the
// interleaved RoPE rotation of one pair, and the PDL prologue every kernel
// of these ops runs first.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

namespace cm::cuda::dev {

__device__ __forceinline__ float bf(uint16_t h) { return __uint_as_float(uint32_t(h) << 16); }
__device__ __forceinline__ uint16_t to_bf(float f) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(f));
}

// Stores v as f32 or (rounded to nearest even) bf16 element i of y.
__device__ __forceinline__ void store_out(void* y, bool y_bf16, int64_t i, float v) {
  if (y_bf16)
    static_cast<uint16_t*>(y)[i] = to_bf(v);
  else
    static_cast<float*>(y)[i] = v;
}

// PDL: the op kernels do nothing before their inputs are ready, so they wait
// first (before any early exit) and let the next kernel launch at once.
__device__ __forceinline__ void pdl_wait_and_release() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;");
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum of v over the block (blockDim.x a multiple of 32, at most 1024); every
// thread gets the result. tmp: 32 floats of shared memory. Fixed order.
__device__ __forceinline__ float block_sum(float v, float* tmp) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // tmp may still be read by a previous call
  if (lane == 0) tmp[warp] = v;
  __syncthreads();
  float s = lane < nw ? tmp[lane] : 0.f;
  return warp_sum(s);
}

// Exclusive prefix sum of v over the block (blockDim.x a multiple of 32);
// total gets the block's sum. tmp: 33 ints of shared memory.
__device__ __forceinline__ int block_excl_scan(int v, int* tmp, int& total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int incl = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int x = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += x;
  }
  __syncthreads();  // tmp may still be read by a previous call
  if (lane == 31) tmp[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    const int w = lane < int(blockDim.x >> 5) ? tmp[lane] : 0;
    int wi = w;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int x = __shfl_up_sync(0xffffffffu, wi, o);
      if (lane >= o) wi += x;
    }
    tmp[lane] = wi - w;
    if (lane == 31) tmp[32] = wi;
  }
  __syncthreads();
  total = tmp[32];
  return incl - v + tmp[warp];
}

// Rotates the pair (a, b) = (x[2i], x[2i+1]) by angle pos * freq (inverse: by
// -angle). cos/sin of the fp32 angle in full precision, as the CPU does.
__device__ __forceinline__ void rope_pair(float& a, float& b, float freq, int64_t pos, float attention_factor,
                                          bool inverse) {
  const float ang = freq * float(pos);
  float s, c;
  sincosf(ang, &s, &c);
  c *= attention_factor;
  s *= attention_factor;
  if (inverse) s = -s;
  const float na = a * c - b * s, nb = b * c + a * s;
  a = na;
  b = nb;
}

// rope_pair with every operation rounded on its own (no FMA contraction), so it gives the same bits in
// every kernel it is inlined into (attention's in-CTA and combine epilogues must agree bit for bit).
__device__ __forceinline__ void rope_pair_rn(float& a, float& b, float freq, int64_t pos, float attention_factor,
                                             bool inverse) {
  float s, c;
  sincosf(__fmul_rn(freq, float(pos)), &s, &c);
  c = __fmul_rn(c, attention_factor);
  s = __fmul_rn(s, attention_factor);
  if (inverse) s = -s;
  const float na = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s)), nb = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
  a = na;
  b = nb;
}

}  // namespace cm::cuda::dev
