// Dense BF16-weight linear on tensor cores (dense_linear in backend_kernels.h
// routes BF16 weights here): y[m, n] = alpha · Σ_k x[m, g·K + k] · W[n, k],
// n in weight group g. The router, compressor and indexer projections and a
// BF16 LM head run through it at every batch size.
//
// Exactness: x is f32 and the tensor cores take bf16, so each x value is split
// into three bf16 parts x = hi + mid + lo (each part holds the next 8 bits of
// the 24-bit significand, so the sum is exact for normal values); W is bf16
// already. Every k16 step runs three mma.sync m16n8k16 (hi, mid, lo) into an
// fp32 accumulator: the products are exact and only the fp32 accumulation
// rounds, as in an fp32 dot product. (bf16 x, e.g. a cast input, takes one.)
//
// Batch invariance: an output's arithmetic is fixed by the weight's shape
// (N, K, groups) alone. K is cut into S chunks (dense_mma_chunk_blocks: more
// chunks for narrow weights); within a chunk the CTA's 8 warps take
// interleaved 32-wide k blocks (warp w: blocks w, w + 8, …), the eight partial
// sums are added in warp order, and the chunk sums are added in chunk order. At
// one token (M <= 16) each chunk is its own CTA, so a narrow weight (the
// router: 32 column tiles) still spreads over every SM, and the last CTA of a
// column tile to arrive adds the chunk sums (sm90_splitk.cuh's pattern); for
// more rows one CTA runs the chunks in turn. Both add in the same order and
// rows never mix in mma.sync, so the tile (16 or 32 rows, 8 or 32 columns)
// and the batch change no bit of a row's result.
#include <algorithm>

#include "backend/cuda/step/step_kernels.h"
#include "backend/cuda/core/cuda_util.h"
#include "backend/cuda/core/ops_device.cuh"
#include "backend/cuda/linear/sm90_nvfp4.cuh"

namespace cm::cuda {

namespace {

constexpr int kMmaWarps = 8;

__device__ __forceinline__ uint32_t pack_bf16x2(uint16_t lo_k, uint16_t hi_k) {
  return uint32_t(lo_k) | (uint32_t(hi_k) << 16);
}

// K is walked in 32-wide blocks, each two mma.sync m16n8k16 steps, with k
// permuted inside the block so that every operand load is 16 bytes wide: lane
// (g, t) reads elements 8t .. 8t+7 of its weight row (one uint4) and of its x
// rows, and step s takes 8t+4s, +1 as the fragment's "k = 2t, 2t+1" pair and
// 8t+4s+2, +3 as its "k = 2t+8, 2t+9" pair, for W and x alike — the same
// products, a fixed grouping. (With 4-byte loads per step the CSA
// compressor's 4096 -> 1024 projection streamed at ~0.6 TB/s at one token.)
// load_x reads a 16-row tile's words of one block — rows g and g + 8, f32 x: 8
// floats each, bf16 x: 4 words each — and split_x makes step s's three bf16
// parts (or passes the bf16 words through).
template <bool XBF>
__device__ __forceinline__ void load_x(const void* x, int64_t ldx, int64_t col0, int64_t r0, int64_t M, int64_t k,
                                       int64_t kbound, uint32_t (&r)[16]) {
#pragma unroll
  for (int rh = 0; rh < 2; ++rh) {
    const int64_t row = r0 + 8 * rh;
    const bool ok = row < M && k < kbound;  // K % 8 == 0: a lane's 8 elements are all in or all out
    if constexpr (XBF) {
      uint4 v = make_uint4(0, 0, 0, 0);
      if (ok) v = *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(x) + row * ldx + col0 + k);
      r[4 * rh] = v.x;
      r[4 * rh + 1] = v.y;
      r[4 * rh + 2] = v.z;
      r[4 * rh + 3] = v.w;
    } else {
      const float* src = static_cast<const float*>(x) + row * ldx + col0 + k;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if (ok) v = reinterpret_cast<const float4*>(src)[h];
        r[8 * rh + 4 * h] = __float_as_uint(v.x);
        r[8 * rh + 4 * h + 1] = __float_as_uint(v.y);
        r[8 * rh + 4 * h + 2] = __float_as_uint(v.z);
        r[8 * rh + 4 * h + 3] = __float_as_uint(v.w);
      }
    }
  }
}

template <bool XBF>
__device__ __forceinline__ void split_x(const uint32_t (&r)[16], int s, uint32_t (&a)[3][4]) {
#pragma unroll
  for (int reg = 0; reg < 4; ++reg) {  // a0: (g, pair 0), a1: (g+8, pair 0), a2: (g, pair 1), a3: (g+8, pair 1)
    const int rh = reg & 1, pair = reg >> 1;
    if constexpr (XBF) {
      a[0][reg] = r[4 * rh + 2 * s + pair];
    } else {
      const int at = 8 * rh + 4 * s + 2 * pair;
      const float f[2] = {__uint_as_float(r[at]), __uint_as_float(r[at + 1])};
      uint16_t p[3][2];
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        p[0][e] = dev::to_bf(f[e]);
        const float r1 = f[e] - dev::bf(p[0][e]);
        p[1][e] = dev::to_bf(r1);
        p[2][e] = dev::to_bf(r1 - dev::bf(p[1][e]));
      }
#pragma unroll
      for (int part = 0; part < 3; ++part) a[part][reg] = pack_bf16x2(p[part][0], p[part][1]);
    }
  }
}

struct MmaArgs {
  const uint16_t* w;  // [groups · rpg, K] bf16
  int64_t K, rpg, blocks_per_group;
  const void* x;  // [M, ldx] f32 or bf16
  int64_t M, ldx;
  void* y;  // [M, ldy] f32 or bf16
  bool y_bf16;
  int64_t ldy;
  float alpha;
  int64_t chunk_blocks;  // 32-wide k blocks per chunk
  int chunks;           // S: chunks of K, added in order
  int ksplit;           // CTAs per column tile along K: S (one chunk each) or 1 (all chunks in turn)
  bool prefetch;        // at one row block, fetch the CTA's weight slice into L2 before the PDL wait
  float* partials;      // ksplit > 1: [ksplit, gridDim.x, kAcc, 32] chunk sums
  unsigned* counters;   // ksplit > 1: [gridDim.x] arrivals, back at zero after each launch
};

// MT 16-row tiles × NT 8-column tiles per CTA; the 8 warps split each chunk of K.
template <int MT, int NT, bool XBF>
__global__ void __launch_bounds__(32 * kMmaWarps, 2) dense_mma_kernel(const MmaArgs p) {
  constexpr int kParts = XBF ? 1 : 3, kAcc = MT * NT * 4, kOwn = (kAcc + kMmaWarps - 1) / kMmaWarps;
  __shared__ float red[kMmaWarps][kAcc][32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t grp = blockIdx.x / p.blocks_per_group;
  const int64_t c0 = (blockIdx.x % p.blocks_per_group) * (8 * NT);  // the CTA's first column within its group
  const int64_t m0 = int64_t(blockIdx.y) * (16 * MT);
  const int64_t col0 = grp * p.K;                                   // the group's columns of x
  const int64_t nblk = (p.K + 31) / 32;
  const int c_begin = p.ksplit > 1 ? int(blockIdx.z) : 0, c_end = p.ksplit > 1 ? c_begin + 1 : p.chunks;
  const uint16_t* wrow[NT];
  bool wok[NT];
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    const int64_t cg = c0 + 8 * j + g;  // the B fragment's column n = g of tile j
    wok[j] = cg < p.rpg;
    wrow[j] = p.w + (grp * p.rpg + (wok[j] ? cg : 0)) * p.K;
  }
  // One row block (a decode step) of a weight that fits in L2 many times over:
  // the CTA's slice is read once, so it is fetched into L2 while the previous
  // kernel still runs (weights are not its output). (A BF16 LM head, 1 GB, is
  // not: its CTAs' prefetches would evict each other's before use.)
  if (p.prefetch && gridDim.y == 1 && int(threadIdx.x) < 8 * NT) {
    const int64_t cg = c0 + threadIdx.x;
    const int64_t k_lo = int64_t(c_begin) * p.chunk_blocks * 32;
    const int64_t k_hi = min(p.K, int64_t(c_end) * p.chunk_blocks * 32);
    if (cg < p.rpg && k_hi > k_lo)
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p.w + (grp * p.rpg + cg) * p.K + k_lo),
                   "r"(uint32_t((k_hi - k_lo) * 2))
                   : "memory");
  }
  dev::pdl_wait_and_release();
  // The running chunk total of the elements this thread owns: element e of the
  // tile (e = (i·NT + j)·4 + reg, as in acc) belongs to warp e mod 8.
  float tot[kOwn];
#pragma unroll
  for (int q = 0; q < kOwn; ++q) tot[q] = 0.f;
  // Warp w takes the chunk's k blocks w, w + 8, …, U of them per round: the
  // round's weight and x loads are all issued before its first mma (one block
  // per round left every warp waiting a full memory latency per block). Tall
  // tiles (M > 16: prefill, many CTAs, compute-bound) keep one block per
  // round: the registers of a deeper round halved their occupancy and slowed
  // them (~30%, the compressor projections at 2,048 rows).
  constexpr int U = MT == 1 ? (NT == 1 ? 4 : 2) : 1;
  for (int c = c_begin; c < c_end; ++c) {
    const int64_t b_lo = int64_t(c) * p.chunk_blocks, b_hi = min(nblk, b_lo + p.chunk_blocks);
    float acc[MT][NT][4];
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;
    for (int64_t b0 = b_lo + warp; b0 < b_hi; b0 += int64_t(kMmaWarps) * U) {
      uint4 wv[U][NT];
      uint32_t xr[U][MT][16];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        // Past the chunk's last block nothing is loaded (the next chunk is another CTA's).
        const int64_t blk = b0 + int64_t(u) * kMmaWarps, k = blk * 32 + 8 * t, kb = blk < b_hi ? p.K : 0;
#pragma unroll
        for (int j = 0; j < NT; ++j)
          wv[u][j] = wok[j] && k < kb ? *reinterpret_cast<const uint4*>(wrow[j] + k) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int i = 0; i < MT; ++i) load_x<XBF>(p.x, p.ldx, col0, m0 + 16 * i + g, p.M, k, kb, xr[u][i]);
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (b0 + int64_t(u) * kMmaWarps >= b_hi) break;  // warp-uniform; no mma past the chunk's last block
#pragma unroll
        for (int s = 0; s < 2; ++s)
#pragma unroll
          for (int i = 0; i < MT; ++i) {
            uint32_t a[3][4];
            split_x<XBF>(xr[u][i], s, a);
#pragma unroll
            for (int j = 0; j < NT; ++j) {
              const uint32_t b0w = s ? wv[u][j].z : wv[u][j].x, b1w = s ? wv[u][j].w : wv[u][j].y;
#pragma unroll
              for (int part = 0; part < kParts; ++part) sm90::mma_16816(acc[i][j], a[part], b0w, b1w);
            }
          }
      }
    }
    // The warps' partial sums added in warp order, then to the chunk total; each
    // element by its owner warp (the order is the same whichever warp adds).
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) red[warp][(i * NT + j) * 4 + e][lane] = acc[i][j][e];
    __syncthreads();
#pragma unroll
    for (int q = 0; q < kOwn; ++q) {
      const int e = q * kMmaWarps + warp;
      if (e < kAcc) {
        float v = red[0][e][lane];
        for (int w2 = 1; w2 < kMmaWarps; ++w2) v += red[w2][e][lane];
        tot[q] += v;
      }
    }
    __syncthreads();  // red is rewritten by the next chunk
  }
  if (p.ksplit > 1) {
    // Chunk sums of this column tile: the last CTA to arrive adds them in chunk order.
    float* part = p.partials + (int64_t(blockIdx.z) * gridDim.x + blockIdx.x) * (kAcc * 32);
#pragma unroll
    for (int q = 0; q < kOwn; ++q) {
      const int e = q * kMmaWarps + warp;
      if (e < kAcc) part[e * 32 + lane] = tot[q];
    }
    __threadfence();
    __syncthreads();
    __shared__ unsigned is_last;
    if (threadIdx.x == 0) is_last = atomicAdd(&p.counters[blockIdx.x], 1u) == unsigned(p.ksplit - 1);
    __syncthreads();
    if (!is_last) return;
    __threadfence();
#pragma unroll
    for (int q = 0; q < kOwn; ++q) {
      const int e = q * kMmaWarps + warp;
      if (e < kAcc) {
        float v = 0.f;
        for (int sp = 0; sp < p.ksplit; ++sp)
          v += __ldcg(p.partials + (int64_t(sp) * gridDim.x + blockIdx.x) * (kAcc * 32) + e * 32 + lane);
        tot[q] = v;
      }
    }
    if (threadIdx.x == 0) p.counters[blockIdx.x] = 0;
  }
#pragma unroll
  for (int q = 0; q < kOwn; ++q) {
    const int e = q * kMmaWarps + warp;
    if (e >= kAcc) continue;
    const int i = e / (NT * 4), j = (e / 4) % NT, reg = e % 4;
    // c0, c1: row g, columns 2t, 2t+1; c2, c3: row g + 8.
    const int64_t row = m0 + 16 * i + g + (reg >= 2 ? 8 : 0);
    const int64_t cg = c0 + 8 * j + 2 * t + (reg & 1);
    if (row < p.M && cg < p.rpg) dev::store_out(p.y, p.y_bf16, row * p.ldy + grp * p.rpg + cg, tot[q] * p.alpha);
  }
}

// S, the chunks K is cut into: a function of the weight's shape only (never of
// M or the device), so the bits of a row do not depend on the batch. Narrow
// weights get more chunks so that a one-token call still has ~256 CTAs (one
// wave at two per SM) streaming the weight; a chunk keeps at least one k block
// per warp.
int64_t dense_mma_chunk_blocks(int64_t N, int64_t K, int groups) {
  const int64_t tiles = (N / groups + 7) / 8 * groups, nblk = (K + 31) / 32;
  int64_t s = tiles >= 256 ? 1 : (256 + tiles - 1) / tiles;
  s = std::max<int64_t>(1, std::min({s, int64_t(16), nblk / kMmaWarps}));
  return (nblk + s - 1) / s;
}

template <int MT, int NT>
void launch_mma(Context& ctx, const uint16_t* w, int64_t N, int64_t K, int groups, const void* x, bool x_bf16,
                int64_t M, int64_t ldx, void* y, bool y_bf16, int64_t ldy, float alpha) {
  MmaArgs p{};
  p.w = w;
  p.K = K;
  p.rpg = N / groups;
  p.blocks_per_group = (p.rpg + 8 * NT - 1) / (8 * NT);
  p.x = x;
  p.M = M;
  p.ldx = ldx;
  p.y = y;
  p.y_bf16 = y_bf16;
  p.ldy = ldy;
  p.alpha = alpha;
  p.chunk_blocks = dense_mma_chunk_blocks(N, K, groups);
  const int64_t nblk = (K + 31) / 32, blocks = int64_t(groups) * p.blocks_per_group;
  p.chunks = int((nblk + p.chunk_blocks - 1) / p.chunk_blocks);
  const int64_t row_blocks = (M + 16 * MT - 1) / (16 * MT);
  CM_CU_CHECK(blocks < (int64_t(1) << 31) && row_blocks < 65536,
              "dense_linear: grid too large (%lld columns, %lld rows)", (long long)N, (long long)M);
  // One CTA per chunk at one row block, where the workspace holds the chunk sums (it does for
  // every narrow weight on a GPU with 64+ SMs); else the chunks in turn: the same bits, fewer CTAs.
  const size_t floats = size_t(p.chunks) * size_t(blocks) * MT * NT * 4 * 32;
  const bool fits = floats <= ctx.workspace().splitk_floats && size_t(blocks) <= ctx.workspace().splitk_counters;
  p.ksplit = row_blocks == 1 && fits ? p.chunks : 1;
  if (p.ksplit > 1) {
    p.partials = ctx.splitk_partials(floats);
    p.counters = ctx.splitk_counters(size_t(blocks));
  }
  p.prefetch = N * K * 2 <= (int64_t(16) << 20);
  const dim3 grid(unsigned(blocks), unsigned(row_blocks), unsigned(p.ksplit));
  if (x_bf16)
    launch_kernel(ctx, dense_mma_kernel<MT, NT, true>, grid, dim3(32 * kMmaWarps), 0, "dense_mma_kernel", p);
  else
    launch_kernel(ctx, dense_mma_kernel<MT, NT, false>, grid, dim3(32 * kMmaWarps), 0, "dense_mma_kernel", p);
}

}  // namespace

bool dense_mma_supported(int64_t K, int64_t ldx, const void* x, bool x_bf16) {
  // 16-byte loads of 8 weights and of 8 x values (f32: two): K a multiple of 8, x rows 16-byte aligned.
  return K % 8 == 0 && ldx % (x_bf16 ? 8 : 4) == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
}

void dense_linear_mma(Context& ctx, const uint16_t* w, int64_t N, int64_t K, int groups, const void* x, bool x_bf16,
                      int64_t M, int64_t ldx, void* y, bool y_bf16, int64_t ldy, float alpha) {
  if (M <= 0) return;
  CM_CU_CHECK(dense_mma_supported(K, ldx, x, x_bf16), "dense_linear_mma: K %lld / row stride %lld not supported",
              (long long)K, (long long)ldx);
  // Wide tiles only where they still leave enough CTAs to stream the weight from every SM.
  const bool wide_n = (N / groups) / 32 >= 256;
  const bool tall_m = M > 16;
  if (tall_m && wide_n)
    launch_mma<2, 4>(ctx, w, N, K, groups, x, x_bf16, M, ldx, y, y_bf16, ldy, alpha);
  else if (tall_m)
    launch_mma<2, 1>(ctx, w, N, K, groups, x, x_bf16, M, ldx, y, y_bf16, ldy, alpha);
  else if (wide_n)
    launch_mma<1, 4>(ctx, w, N, K, groups, x, x_bf16, M, ldx, y, y_bf16, ldy, alpha);
  else
    launch_mma<1, 1>(ctx, w, N, K, groups, x, x_bf16, M, ldx, y, y_bf16, ldy, alpha);
}

}  // namespace cm::cuda
