// Device helpers shared by the NVFP4 kernels (linear, grouped MoE, dequant):
// in-register E2M1 -> BF16 expansion of the packed layout (nvfp4_pack.h),
// block-scale decode, and the mma.sync m16n8k16 BF16 step.
//
// Exactness: the raw operand is the E2M1 value times 2^-126 (the three
// exponent/mantissa bits land in the low bits of the bf16 exponent field, so
// code 1 = 0.5 becomes a bf16 subnormal); multiplying it by the block scale
// times 2^100 (a normal bf16) gives value*scale*2^-26 exactly, because the
// product has at most 5 significant bits and stays in bf16's normal range.
// The FP32 epilogue multiplies by 2^26 * scale_2.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "backend/cuda/linear/nvfp4_pack.h"

namespace cm::cuda::sm90 {

__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
  uint32_t d;
  // fma with -0 is an exact multiply (keeps +0 for +0 products).
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(0x80008000u));
  return d;
}

__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Streaming 16-byte weight load: read once, do not keep in L1.
__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// Scale pair byte (row g low, row g+8 high) -> bf16x2 {s, s} for each row.
__device__ __forceinline__ void decode_scales(uint32_t sv, uint32_t& sg, uint32_t& sg8) {
  constexpr uint32_t kBias = (uint32_t(kScaleBias) << 7) | (uint32_t(kScaleBias) << 23);
  sg = __byte_perm(sv, 0, 0x4040) * 16u + kBias;
  sg8 = __byte_perm(sv, 0, 0x4141) * 16u + kBias;
}

// One packed 32-bit word -> the four bf16x2 A operands of one k16 mma step.
__device__ __forceinline__ void expand_word(uint32_t w, uint32_t sg, uint32_t sg8, uint32_t (&a)[4]) {
  constexpr uint32_t kM0 = 0x81C081C0u;
  const uint32_t p0 = w & kM0;
  const uint32_t p1 = (w << 3) & kM0;
  const uint32_t p2 = (w << 6) & kM0;
  const uint32_t sgn = (w << 1) & 0x80008000u;
  const uint32_t hi = ((w >> 5) & 0x01000100u) | sgn;
  const uint32_t p3 = ((w >> 4) & 0x00C000C0u) | hi;
  a[0] = bf16x2_mul(p0, sg);
  a[1] = bf16x2_mul(p1, sg8);
  a[2] = bf16x2_mul(p2, sg);
  a[3] = bf16x2_mul(p3, sg8);
}

// One 16-row x 64-k chunk against MT groups of 8 activation rows.
// xv[mt][0..1]: this lane's 16 activations (k = 16t .. 16t+15) of token g+8mt.
template <int MT>
__device__ __forceinline__ void chunk_mma(const uint4& wv, uint32_t sv, const uint4 (&xv)[MT][2], float (&acc)[MT][4]) {
  uint32_t sg, sg8;
  decode_scales(sv, sg, sg8);
  const uint32_t ws[4] = {wv.x, wv.y, wv.z, wv.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    uint32_t a[4];
    expand_word(ws[j], sg, sg8, a);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      const uint4& xq = xv[mt][j >> 1];
      const uint32_t b0 = (j & 1) ? xq.z : xq.x;
      const uint32_t b1 = (j & 1) ? xq.w : xq.y;
      mma_16816(acc[mt], a, b0, b1);
    }
  }
}

// This lane's 16 activations (k = 64c + 16t .. +15) of each of its MT tokens
// for chunk c, zeros where the chunk lies past K (kin false) or the token is absent.
template <int MT>
__device__ __forceinline__ void load_x_chunk(uint4 (&xv)[MT][2], const __nv_bfloat16* const (&xrow)[MT],
                                             const bool (&xok)[MT], int64_t c, bool kin) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    if (kin && xok[mt]) {
      const uint4* xp = reinterpret_cast<const uint4*>(xrow[mt] + c * 64);
      xv[mt][0] = __ldg(xp);
      xv[mt][1] = __ldg(xp + 1);
    } else {
      xv[mt][0] = xv[mt][1] = make_uint4(0, 0, 0, 0);
    }
  }
}

// Registers for U chunks of NW weight matrices and their activations.
template <int MT, int U, int NW>
struct ChunkBatch {
  uint4 wv[U][NW];
  uint32_t sv[U][NW];
  uint4 xv[U][MT][2];
};

template <int MT, int U, int NW>
__device__ __forceinline__ void load_batch(ChunkBatch<MT, U, NW>& b, const uint4* const (&wb)[NW],
                                           const uint16_t* const (&sb)[NW], const __nv_bfloat16* const (&xrow)[MT],
                                           const bool (&xok)[MT], int64_t c0, int64_t c_end, int64_t cstep, int64_t K,
                                           int t) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int64_t c = c0 + cstep * u;
    const bool cin = c < c_end;
#pragma unroll
    for (int m = 0; m < NW; ++m) {
      b.wv[u][m] = cin ? ld_stream(wb[m] + c * 32) : make_uint4(0, 0, 0, 0);
      b.sv[u][m] = cin ? uint32_t(sb[m][c * 32]) : 0u;
    }
    load_x_chunk<MT>(b.xv[u], xrow, xok, c, cin && (c * 64 + 16 * t < K));
  }
}

template <int MT, int U, int NW>
__device__ __forceinline__ void compute_batch(const ChunkBatch<MT, U, NW>& b, int64_t c0, int64_t c_end, int64_t cstep,
                                              float (&acc)[NW][MT][4]) {
#pragma unroll
  for (int u = 0; u < U; ++u)
    if (c0 + cstep * u < c_end) {
#pragma unroll
      for (int m = 0; m < NW; ++m) chunk_mma<MT>(b.wv[u][m], b.sv[u][m], b.xv[u], acc[m]);
    }
}

// One warp's walk over chunks c_first, c_first+cstep, ... < c_end of NW
// weight matrices that share the activations (NW = 2: fused gate/up).
// PIPE: software pipelined, the loads of the next U chunks are issued before
// the current U chunks are expanded and multiplied (2U chunks in flight, more
// registers, fewer resident warps). !PIPE: U chunks in flight, lower register
// use and more resident warps; measured faster when there are many row blocks
// (one pass over a large matrix) and for the MoE kernels.
// wb/sb point at the row block's first chunk (already offset by lane / by
// g*4+t); xrow at the token's first activation of this lane (k = 16t).
template <int MT, int U, int NW, bool PIPE>
__device__ __forceinline__ void warp_kloop(const uint4* const (&wb)[NW], const uint16_t* const (&sb)[NW],
                                           const __nv_bfloat16* const (&xrow)[MT], const bool (&xok)[MT],
                                           int64_t c_first, int64_t c_end, int64_t cstep, int64_t K, int t,
                                           float (&acc)[NW][MT][4]) {
  if (c_first >= c_end) return;
  const int64_t step = cstep * U;
  if constexpr (!PIPE) {
    for (int64_t c0 = c_first; c0 < c_end; c0 += step) {
      ChunkBatch<MT, U, NW> a;
      load_batch(a, wb, sb, xrow, xok, c0, c_end, cstep, K, t);
      compute_batch(a, c0, c_end, cstep, acc);
    }
    return;
  }
  ChunkBatch<MT, U, NW> a, b;
  load_batch(a, wb, sb, xrow, xok, c_first, c_end, cstep, K, t);
  for (int64_t c0 = c_first;; c0 += 2 * step) {
    if (c0 + step < c_end) load_batch(b, wb, sb, xrow, xok, c0 + step, c_end, cstep, K, t);
    compute_batch(a, c0, c_end, cstep, acc);
    if (c0 + step >= c_end) break;
    if (c0 + 2 * step < c_end) load_batch(a, wb, sb, xrow, xok, c0 + 2 * step, c_end, cstep, K, t);
    compute_batch(b, c0 + step, c_end, cstep, acc);
    if (c0 + 2 * step >= c_end) break;
  }
}

// 16-byte global -> shared copy (L2 only); src_bytes 0 fills the 16 bytes with zeros.
__device__ __forceinline__ void cp_async16(uint32_t d, const void* src, int src_bytes) {
  const size_t g = __cvta_generic_to_global(src);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(g), "r"(src_bytes) : "memory");
}

// One 64-k chunk staged in shared memory (the prefill kernels): NA weight
// fragments (packed 16-row blocks of 512 bytes at w + 512 a, their 64 scale
// bytes at s + 64 a) times 8*MT tokens. xt: this lane's first activation
// (token g, k = 16t) of the chunk, token rows `pitch` bf16 apart. Each
// accumulator gets the mma steps j = 0..3 in order on the same A and B
// fragments as chunk_mma (the decode kernels), so a token's sums are the
// decode kernels' bits; every B read (16 bytes) feeds 2*NA mma.
template <int NA, int MT>
__device__ __forceinline__ void smem_chunk_mma(const unsigned char* w, const unsigned char* s,
                                               const __nv_bfloat16* xt, int pitch, int lane,
                                               float (&acc)[NA][MT][4]) {
  const int g = lane >> 2, t = lane & 3;
  uint4 wv[NA];
  uint32_t sg[NA], sg8[NA];
#pragma unroll
  for (int a = 0; a < NA; ++a) {
    wv[a] = *reinterpret_cast<const uint4*>(w + a * 512 + lane * 16);
    const uint16_t sv = *reinterpret_cast<const uint16_t*>(s + a * 64 + (g * 4 + t) * 2);
    decode_scales(sv, sg[a], sg8[a]);
  }
#pragma unroll
  for (int jp = 0; jp < 2; ++jp) {
    uint32_t af[NA][2][4];
#pragma unroll
    for (int a = 0; a < NA; ++a) {
      expand_word(jp ? wv[a].z : wv[a].x, sg[a], sg8[a], af[a][0]);
      expand_word(jp ? wv[a].w : wv[a].y, sg[a], sg8[a], af[a][1]);
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      const uint4 xq = *reinterpret_cast<const uint4*>(xt + 8 * mt * pitch + 8 * jp);
#pragma unroll
      for (int a = 0; a < NA; ++a) {
        mma_16816(acc[a][mt], af[a][0], xq.x, xq.y);
        mma_16816(acc[a][mt], af[a][1], xq.z, xq.w);
      }
    }
  }
}

// Sums the 4 warps' accumulators of a 16-row x 8*MT-token tile. red must
// hold 4 * 8*MT * 16 floats. Thread i ends with values v = i + 128*q
// (token v/16, row v%16) in vals[q]. Ends with a __syncthreads so red can be reused.
// The group form serves a CTA of several such 4-warp groups (warp: the warp's
// index in its group, tid: the thread's index in its group, red: the group's
// area); every thread of the CTA must call it. Both forms add the four
// partial sums in the same order, (w0 + w1) + (w2 + w3): the MoE decode and
// prefill kernels rely on it for bit-identical results.
template <int MT>
__device__ __forceinline__ void reduce_warps_group(const float (&acc)[MT][4], float* red, int warp, int tid,
                                                   float (&vals)[MT]) {
  const int lane = tid & 31, g = lane >> 2, t = lane & 3;
  constexpr int TS = 8 * MT * 16;  // floats per warp
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    const int tok = 8 * mt + 2 * t;
    red[warp * TS + tok * 16 + g] = acc[mt][0];
    red[warp * TS + (tok + 1) * 16 + g] = acc[mt][1];
    red[warp * TS + tok * 16 + g + 8] = acc[mt][2];
    red[warp * TS + (tok + 1) * 16 + g + 8] = acc[mt][3];
  }
  __syncthreads();
#pragma unroll
  for (int q = 0; q < MT; ++q) {
    const int v = tid + 128 * q;
    vals[q] = (red[v] + red[TS + v]) + (red[2 * TS + v] + red[3 * TS + v]);
  }
  __syncthreads();
}

template <int MT>
__device__ __forceinline__ void reduce_warps(const float (&acc)[MT][4], float* red, float (&vals)[MT]) {
  reduce_warps_group<MT>(acc, red, int(threadIdx.x >> 5), int(threadIdx.x), vals);
}

}  // namespace cm::cuda::sm90
