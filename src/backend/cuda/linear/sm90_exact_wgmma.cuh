// What the two exact wgmma linears (sm90_nvfp4_exact_wgmma.cu, sm90_fp8_exact_wgmma.cu) share: the
// activation reorder into the decode kernels' k positions, its scratch and slabs, and the store of a
// warp's accumulator fragment.
//
// The decode kernels (sm90_decode.cuh, both formats) feed mma.sync step j of a 64-k chunk, on lane
// t's B operand, the activations k = 16t + 4j + {0,1} (logical positions 2t, 2t+1) and 16t + 4j +
// {2,3} (positions 2t+8, 2t+9). wgmma reads its B operand from shared memory in logical order, and
// no copy engine permutes 4-byte pairs, so a pass writes each 64-token x 64-k tile of x in that order,
// 128B-swizzled as desc_sw128 reads it, into scratch; the GEMMs stream those tiles with bulk copies.
#pragma once
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

#include "backend/cuda/core/cuda_util.h"
#include "backend/cuda/linear/sm90_mbarrier.cuh"

namespace cm::cuda::exact_wgmma {

constexpr int kToks = 64;            // tokens per tile (wgmma N)
constexpr int kXTile = kToks * 128;  // bytes of one reordered tile: bf16 [64 tokens][64 positions]

// Bytes of the reordered activations of one 64-token tile (all groups' chunks).
inline size_t tile_bytes(int64_t chunks, int groups) { return size_t(groups) * size_t(chunks) * kXTile; }

// Whether one 64-token tile fits the context's reorder scratch.
inline bool fits_scratch(Context& ctx, int64_t chunks, int groups) {
  return tile_bytes(chunks, groups) <= ctx.reorder_scratch_bytes();
}

// Writes tokens [0, M) of x (rows ldx bf16 apart, groups x K columns) as reordered tiles
// xp[token tile][group chunk] (sm90_exact_wgmma.cu).
void reorder_x(Context& ctx, const uint16_t* x, int64_t ldx, int64_t M, int K, int chunks, int groups, uint8_t* xp);

// Runs gemm(m0, mm, xp) over slabs of tokens [m0, m0 + mm) whose reordered tiles fit the scratch,
// each after its reorder. A row's bits do not depend on the slab it lands in.
template <class Gemm>
void for_each_slab(Context& ctx, const uint16_t* x, int64_t ldx, int64_t M, int K, int64_t chunks, int groups,
                   Gemm&& gemm) {
  const size_t tb = tile_bytes(chunks, groups);
  const int64_t slab = std::min<int64_t>(65535, int64_t(ctx.reorder_scratch_bytes() / tb)) * kToks;
  auto* xp = static_cast<uint8_t*>(ctx.reorder_scratch(size_t((std::min(M, slab) + kToks - 1) / kToks) * tb));
  for (int64_t m0 = 0; m0 < M; m0 += slab) {
    const int64_t mm = std::min(slab, M - m0);
    reorder_x(ctx, x + m0 * ldx, ldx, mm, K, int(chunks), groups, xp);
    gemm(m0, mm, static_cast<const uint8_t*>(xp));
  }
}

// The dynamic shared memory base rounded up to 1024 bytes (128B-swizzled tiles need it; the kernels
// ask for 1024 bytes more than they use).
__device__ __forceinline__ uint8_t* align_1024(uint8_t* raw) {
  return reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t(1023));
}

// The stage ring: `stages` full barriers (the producer's one arrival plus the copies' bytes) and empty
// barriers (one arrival per consumer warp, 8), 8 bytes apart. Thread 0 only; the caller syncs after.
__device__ __forceinline__ void init_ring(uint32_t full0, uint32_t empty0, int stages) {
  for (int i = 0; i < stages; ++i) {
    sm90::mbar_init(full0 + 8 * i, 1);
    sm90::mbar_init(empty0 + 8 * i, 8);
  }
  sm90::mbar_init_fence();
}

// The producer's loop (one thread): for chunk c, stage c % stages, once the consumers freed it: the
// expected bytes tx, the bulk copy of the x tile (xt: this CTA's first tile) to x0 + stage * kXTile, and
// copy_weights(c, stage, full barrier) for the weight copies.
template <class CopyWeights>
__device__ __forceinline__ void produce(int chunks, int stages, uint32_t full0, uint32_t empty0, uint32_t tx,
                                        uint32_t x0, const uint8_t* xt, CopyWeights&& copy_weights) {
  for (int c = 0; c < chunks; ++c) {
    const int st = c % stages;
    const uint32_t full = full0 + 8 * st;
    sm90::mbar_wait(empty0 + 8 * st, (uint32_t(c / stages) & 1u) ^ 1u);
    sm90::mbar_expect_tx(full, tx);
    sm90::bulk_load(x0 + st * kXTile, xt + int64_t(c) * kXTile, kXTile, full);
    copy_weights(c, st, full);
  }
}

// The decode kernels' reduction of output i (sm90_decode.cuh: reduce_warps, splitk_combine): the four warp
// chains as (w0 + w1) + (w2 + w3), then the splits as 0 + v0 + v1 + ... (one split: v0 alone).
__device__ __forceinline__ float chains_sum(const float (&acc)[4][32], int i) {
  return (acc[0][i] + acc[1][i]) + (acc[2][i] + acc[3][i]);
}
__device__ __forceinline__ float add_split(float total, float v, int split, int ksplit) {
  return ksplit == 1 ? v : (split == 0 ? 0.f : total) + v;
}

// Stores one warp's m64n64 wgmma fragment share (v[4q + e]: row `row0` (e < 2) or row0 + 8, token
// tok0 + 8q + 2t + (e & 1)) times mul into y[token][row], tokens < M and rows < N only.
__device__ __forceinline__ void store_fragment(const float (&v)[32], int tok0, int row0, int t, int M, int N, void* y,
                                               int64_t ldy, bool y_bf16, float mul) {
#pragma unroll
  for (int q = 0; q < kToks / 8; ++q)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int tok = tok0 + 8 * q + 2 * t + (e & 1), row = row0 + 8 * (e >> 1);
      if (tok >= M || row >= N) continue;
      const float o = v[4 * q + e] * mul;
      if (y_bf16)
        static_cast<__nv_bfloat16*>(y)[int64_t(tok) * ldy + row] = __float2bfloat16_rn(o);
      else
        static_cast<float*>(y)[int64_t(tok) * ldy + row] = o;
    }
}

}  // namespace cm::cuda::exact_wgmma
