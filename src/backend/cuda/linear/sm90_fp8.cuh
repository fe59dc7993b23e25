// Device helpers of the FP8 128x128-block kernels (linear decode, dequant):
// in-register E4M3 -> BF16 expansion of the packed layout (fp8_pack.h) and the
// per-warp walk over 64-k chunks, built on the NVFP4 helpers (mma_16816,
// ld_stream, bf16x2_mul, the activation fragment order).
//
// Exactness: prmt + shift + mask gives the E4M3 value times 2^-120 as a bf16
// (fp8_pack.h), one exact bf16x2 multiply by 2^120 gives the E4M3 value
// itself, so the mma products are e4m3 * x exactly and never fall into the
// fp32 subnormal range the way 2^-120-scaled operands would. Each chunk's four
// mma steps accumulate into a zeroed fp32 tile that is then fma'd into the
// accumulator with the chunk's block scale in fp32 (E8M0 and F32 scales alike).
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "backend/cuda/linear/linear.h"
#include "backend/cuda/linear/fp8_pack.h"
#include "backend/cuda/linear/sm90_nvfp4.cuh"

namespace cm::cuda {

// The weight, activation and output arguments of the FP8 linear kernels
// (decode and prefill take them as the base of their parameter struct).
struct Fp8Args {
  const uint4* w;
  const float* s;
  int64_t chunks;
  int scale_cols;
  int N, K, row_blocks;
  int rows_per_group;
  const __nv_bfloat16* x;  // [M, ldx]
  int64_t ldx;
  int M;
  void* y;  // [M, ldy], bf16 (y_bf16) or f32
  int64_t ldy;
  int y_bf16;
};

inline Fp8Args fp8_args(const DeviceFp8Linear& w, const uint16_t* x, int64_t M, int64_t ldx, void* y, int64_t ldy,
                        OutType out) {
  Fp8Args a{};
  a.w = w.data.as<const uint4>();
  a.s = w.scales.as<const float>();
  a.chunks = w.chunks;
  a.scale_cols = int(w.scale_cols);
  a.N = int(w.N);
  a.K = int(w.K);
  a.row_blocks = int(w.row_blocks);
  a.rows_per_group = int(w.N / w.groups);
  a.x = reinterpret_cast<const __nv_bfloat16*>(x);
  a.ldx = ldx;
  a.M = int(M);
  a.y = y;
  a.ldy = ldy;
  a.y_bf16 = out == OutType::BF16;
  return a;
}

}  // namespace cm::cuda

namespace cm::cuda::sm90 {

// prmt.b32 in its default mode: selector nibbles with bit 3 set replicate the sign of the chosen byte.
__device__ __forceinline__ uint32_t prmt_sign(uint32_t a, uint32_t sel) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(0u), "r"(sel));
  return d;
}

// Codes in bytes 0,1 (lo) or 2,3 (hi) of w -> bf16x2 holding their exact E4M3 values.
__device__ __forceinline__ uint32_t fp8x2_lo(uint32_t w) {
  return bf16x2_mul(fp8x2_to_bf16x2_raw(prmt_sign(w, 0x9180u)), kBf16x2Pow120);
}
__device__ __forceinline__ uint32_t fp8x2_hi(uint32_t w) {
  return bf16x2_mul(fp8x2_to_bf16x2_raw(prmt_sign(w, 0xB3A2u)), kBf16x2Pow120);
}

// The A operands of k16 step j (k = 64c + 16t + 4j .. +3 of rows g and g+8)
// from a lane's two 16-byte words of a chunk (w0: row g, w1: row g+8).
__device__ __forceinline__ void fp8_step_a(const uint4& w0, const uint4& w1, int j, uint32_t (&a)[4]) {
  const uint32_t r0 = j == 0 ? w0.x : j == 1 ? w0.y : j == 2 ? w0.z : w0.w;
  const uint32_t r1 = j == 0 ? w1.x : j == 1 ? w1.y : j == 2 ? w1.z : w1.w;
  a[0] = fp8x2_lo(r0);
  a[1] = fp8x2_lo(r1);
  a[2] = fp8x2_hi(r0);
  a[3] = fp8x2_hi(r1);
}

// The B operands of step j from a token's 16 activations (xv[0]: k = 16t ..
// +7, xv[1]: +8 .. +15), the order the packed weight layout pairs them in.
__device__ __forceinline__ uint32_t fp8_step_b0(const uint4 (&xv)[2], int j) { return (j & 1) ? xv[j >> 1].z : xv[j >> 1].x; }
__device__ __forceinline__ uint32_t fp8_step_b1(const uint4 (&xv)[2], int j) { return (j & 1) ? xv[j >> 1].w : xv[j >> 1].y; }

// One 16-row x 64-k chunk (w0: row g, w1: row g+8) against MT groups of 8
// tokens; acc += scale * (chunk products). Per output: a zeroed fp32 tile,
// the mma steps j = 0..3 in order, then one fma with the scale. The prefill
// kernel (sm90_fp8_prefill.cu) runs this same sequence per output.
template <int MT>
__device__ __forceinline__ void fp8_chunk_mma(const uint4& w0, const uint4& w1, float scale, const uint4 (&xv)[MT][2],
                                              float (&acc)[MT][4]) {
  float tmp[MT][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) tmp[mt][0] = tmp[mt][1] = tmp[mt][2] = tmp[mt][3] = 0.f;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    uint32_t a[4];
    fp8_step_a(w0, w1, j, a);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) mma_16816(tmp[mt], a, fp8_step_b0(xv[mt], j), fp8_step_b1(xv[mt], j));
  }
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[mt][i] = fmaf(tmp[mt][i], scale, acc[mt][i]);
}

// Registers for U chunks in flight.
template <int MT, int U>
struct Fp8Batch {
  uint4 w0[U], w1[U];
  float s[U];
  uint4 xv[U][MT][2];
};

// wb: the row block's first chunk, offset by lane (uint4 units, 64 per chunk);
// sb: the row block's scale row (one f32 per 128 k = 2 chunks).
template <int MT, int U>
__device__ __forceinline__ void fp8_load(Fp8Batch<MT, U>& b, const uint4* wb, const float* sb,
                                         const __nv_bfloat16* const (&xrow)[MT], const bool (&xok)[MT], int64_t c0,
                                         int64_t c_end, int64_t cstep, int64_t K, int t) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int64_t c = c0 + cstep * u;
    const bool cin = c < c_end;
    b.w0[u] = cin ? ld_stream(wb + c * 64) : make_uint4(0, 0, 0, 0);
    b.w1[u] = cin ? ld_stream(wb + c * 64 + 32) : make_uint4(0, 0, 0, 0);
    b.s[u] = cin ? __ldg(sb + (c >> 1)) : 0.f;
    load_x_chunk<MT>(b.xv[u], xrow, xok, c, cin && (c * 64 + 16 * t < K));
  }
}

template <int MT, int U>
__device__ __forceinline__ void fp8_compute(const Fp8Batch<MT, U>& b, int64_t c0, int64_t c_end, int64_t cstep,
                                            float (&acc)[MT][4]) {
#pragma unroll
  for (int u = 0; u < U; ++u)
    if (c0 + cstep * u < c_end) fp8_chunk_mma<MT>(b.w0[u], b.w1[u], b.s[u], b.xv[u], acc);
}

// One warp's walk over chunks c_first, c_first+cstep, ... < c_end; PIPE as in
// warp_kloop (sm90_nvfp4.cuh): the next U chunks' loads are issued before the
// current U chunks are expanded and multiplied.
template <int MT, int U, bool PIPE>
__device__ __forceinline__ void fp8_warp_kloop(const uint4* wb, const float* sb, const __nv_bfloat16* const (&xrow)[MT],
                                               const bool (&xok)[MT], int64_t c_first, int64_t c_end, int64_t cstep,
                                               int64_t K, int t, float (&acc)[MT][4]) {
  if (c_first >= c_end) return;
  const int64_t step = cstep * U;
  if constexpr (!PIPE) {
    for (int64_t c0 = c_first; c0 < c_end; c0 += step) {
      Fp8Batch<MT, U> a;
      fp8_load(a, wb, sb, xrow, xok, c0, c_end, cstep, K, t);
      fp8_compute(a, c0, c_end, cstep, acc);
    }
    return;
  }
  Fp8Batch<MT, U> a, b;
  fp8_load(a, wb, sb, xrow, xok, c_first, c_end, cstep, K, t);
  for (int64_t c0 = c_first;; c0 += 2 * step) {
    if (c0 + step < c_end) fp8_load(b, wb, sb, xrow, xok, c0 + step, c_end, cstep, K, t);
    fp8_compute(a, c0, c_end, cstep, acc);
    if (c0 + step >= c_end) break;
    if (c0 + 2 * step < c_end) fp8_load(a, wb, sb, xrow, xok, c0 + 2 * step, c_end, cstep, K, t);
    fp8_compute(b, c0 + step, c_end, cstep, acc);
    if (c0 + 2 * step >= c_end) break;
  }
}

}  // namespace cm::cuda::sm90
