// Tensor-core steps of one attention segment (attention.cu): the scores
// S = Q·Eᵀ and the weighted sum O = P·E of a 16-head group against the
// segment's 64 candidate rows E (MQA: keys = values), as mma.sync m16n8k16
// (bf16 operands, fp32 accumulate) on operands in shared memory read by
// ldmatrix.
//
// Why these layouts: every operand is stored row-major as it arrives (q rows,
// candidate rows), and ldmatrix gives each fragment directly — the plain form
// for Q (A) and E as the "col" B of S = Q·Eᵀ (a candidate row is a column of
// Eᵀ), the .trans form for E as the B of P·E. Row strides are the row length
// plus 8 elements (16 bytes), so the 8 rows one ldmatrix phase reads fall in
// 8 different 16-byte bank groups (no conflicts) for every supported dim.
//
// Exactness: q and the rows are bf16 already, so the score products are exact
// and only the fp32 accumulation rounds, as in a SIMT fp32 dot product. P
// (fp32 exp(S − m_s) in [0, 1]) is split into two bf16 parts p = hi + lo (hi =
// bf16(p), lo = bf16(p − hi)): each weight keeps 16 significant bits (relative
// error ≤ 2^-16), and the second mma reuses the E fragments already in
// registers, so o_s stays close to an fp32 sum for one more tensor
// instruction per fragment and no extra shared-memory traffic (the bound).
//
// Fixed order: each output element is one chain of mma steps in a fixed k
// order (the scores in two chains, even and odd k16 steps, added at the end);
// no value depends on the warp count or the other heads' rows.
#pragma once
#include <cstdint>

#include "backend/cuda/linear/sm90_nvfp4.cuh"

namespace cm::cuda::attn {

constexpr int kMmaWarps = 8;   // the CTA: 8 warps, warp w scores candidates [8w, 8w + 8)
constexpr int kMmaRows = 16;   // heads per mma tile (a group of fewer heads is padded with zero rows)
constexpr int kMaxPairs = 4;   // 16-channel column pairs per warp in P·E: 512 / 16 / kMmaWarps

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ldmatrix: lanes 8j..8j+7 give the 8 row addresses (16 bytes each) of
// matrix j; lane l receives row l/4, elements 2(l%4), 2(l%4)+1 of each
// matrix (.trans: column l/4, rows 2(l%4), 2(l%4)+1).
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const uint16_t* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldsm_x2(uint32_t (&r)[2], const uint16_t* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], const uint16_t* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// 16-byte global -> shared copy that bypasses registers and L1 (the rows are
// gathered once per segment); cp_async_wait_all before the barrier that
// publishes them.
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_addr(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }

// Raw scores of candidates [8·warp, 8·warp + 8) against the 16 rows of q
// (dim channels, dim a multiple of 16): s as the mma C fragment, s[0..1] =
// (row g, candidates 8·warp + 2t, +1), s[2..3] = (row g + 8, the same), g =
// lane/4, t = lane%4. q: [16][qs] bf16; e: [64][es] bf16.
__device__ __forceinline__ void mma_scores(const uint16_t* q, int qs, const uint16_t* e, int es, int dim, int warp,
                                           int lane, float (&s)[4]) {
  float acc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
  // A (x4): lanes 0-15 address rows 0-15 at k 0-7, lanes 16-31 the same rows at k 8-15.
  const uint16_t* qa = q + (lane & 15) * qs + (lane >> 4) * 8;
  // B (x4 over 32 channels, x2 over 16): lanes 8j..8j+7 address the warp's 8 candidates at k 8j.
  const uint16_t* eb = e + (warp * 8 + (lane & 7)) * es + (lane >> 3) * 8;
  int k = 0;
#pragma unroll 2
  for (; k + 32 <= dim; k += 32) {
    uint32_t a0[4], a1[4], b[4];
    ldsm_x4(b, eb + k);
    ldsm_x4(a0, qa + k);
    ldsm_x4(a1, qa + k + 16);
    sm90::mma_16816(acc[0], a0, b[0], b[1]);
    sm90::mma_16816(acc[1], a1, b[2], b[3]);
  }
  if (k < dim) {  // dim == 16: one k16 step
    uint32_t a0[4], b[2];
    ldsm_x2(b, eb + k);
    ldsm_x4(a0, qa + k);
    sm90::mma_16816(acc[0], a0, b[0], b[1]);
  }
#pragma unroll
  for (int r = 0; r < 4; ++r) s[r] = __fadd_rn(acc[0][r], acc[1][r]);
}

// o = P·E over candidates [0, 16·ksteps) for this warp's column pairs
// (channels [16·pr, 16·pr + 16), pr = warp + kMmaWarps·j, j < kMaxPairs,
// pr < dim/16): o[j][h] is the C fragment of channels 16·pr + 8h … + 7,
// o[j][h][0..1] = (row g, channels 2t, 2t+1), o[j][h][2..3] = (row g + 8, …).
// P = ph + pl: [16][ps] bf16 each; e: [64][es] bf16. Order per element: k16
// steps in order, hi then lo within each.
__device__ __forceinline__ void mma_pv(const uint16_t* ph, const uint16_t* pl, int ps, const uint16_t* e, int es,
                                       int dim, int ksteps, int warp, int lane, float (&o)[kMaxPairs][2][4]) {
#pragma unroll
  for (int j = 0; j < kMaxPairs; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int r = 0; r < 4; ++r) o[j][h][r] = 0.f;
  const int pairs = dim / 16;
  const int poff = (lane & 15) * ps + (lane >> 4) * 8;
  // B (x4 .trans): lanes 0-15 address candidates 0-15 at channel 0 of the pair, lanes 16-31 at channel 8:
  // b[0], b[1] = the k halves of the first 8 channels, b[2], b[3] of the next 8.
  const uint16_t* eb = e + (lane & 15) * es + (lane >> 4) * 8;
  for (int kk = 0; kk < ksteps; ++kk) {
    uint32_t ah[4], al[4];
    ldsm_x4(ah, ph + poff + 16 * kk);
    ldsm_x4(al, pl + poff + 16 * kk);
#pragma unroll
    for (int j = 0; j < kMaxPairs; ++j) {
      const int pr = warp + kMmaWarps * j;
      if (pr < pairs) {
        uint32_t b[4];
        ldsm_x4_trans(b, eb + 16 * kk * es + 16 * pr);
        sm90::mma_16816(o[j][0], ah, b[0], b[1]);
        sm90::mma_16816(o[j][0], al, b[0], b[1]);
        sm90::mma_16816(o[j][1], ah, b[2], b[3]);
        sm90::mma_16816(o[j][1], al, b[2], b[3]);
      }
    }
  }
}

}  // namespace cm::cuda::attn
