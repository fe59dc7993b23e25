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
// Batch invariance: an output's arithmetic is fixed by K alone. The CTA's 8
// warps split K by interleaved k16 steps (warp w takes steps w, w + 8, …) and
// the eight partial sums are added in warp order; rows never mix in mma.sync.
// The tile (16 or 32 rows, 8 or 32 columns per CTA) is chosen by M and N and
// changes no bit, so a row's result does not depend on the other rows.
#include "backend/cuda/backend_kernels.h"
#include "backend/cuda/cuda_util.h"
#include "backend/cuda/ops_device.cuh"
#include "backend/cuda/sm90_nvfp4.cuh"

namespace cm::cuda {

namespace {

constexpr int kMmaWarps = 8;

__device__ __forceinline__ uint32_t pack_bf16x2(uint16_t lo_k, uint16_t hi_k) {
  return uint32_t(lo_k) | (uint32_t(hi_k) << 16);
}

// The A fragment of one 16-row tile as mma.sync m16n8k16 takes it — rows g and
// g + 8, columns k..k+1 and k+8..k+9 of the step (k = 2t) — in two halves so
// that a warp can issue the loads of several k16 steps before using any:
// load_x reads the raw words (f32 x: 8 words, bf16 x: 4), split_x makes the
// three bf16 parts (or passes the bf16 words through).
template <bool XBF>
__device__ __forceinline__ void load_x(const void* x, int64_t ldx, int64_t col0, int64_t r0, int64_t M, int64_t k,
                                       int64_t K, uint32_t (&r)[8]) {
  const int64_t rows[2] = {r0, r0 + 8};
  const int64_t ks[2] = {k, k + 8};
#pragma unroll
  for (int kh = 0; kh < 2; ++kh)
#pragma unroll
    for (int rh = 0; rh < 2; ++rh) {
      const int reg = kh * 2 + rh;  // a0: (g, k), a1: (g+8, k), a2: (g, k+8), a3: (g+8, k+8)
      const bool ok = rows[rh] < M && ks[kh] < K;
      if constexpr (XBF) {
        r[reg] = ok ? *reinterpret_cast<const uint32_t*>(static_cast<const uint16_t*>(x) + rows[rh] * ldx + col0 +
                                                         ks[kh])
                    : 0u;
      } else {
        float2 v = make_float2(0.f, 0.f);
        if (ok) v = *reinterpret_cast<const float2*>(static_cast<const float*>(x) + rows[rh] * ldx + col0 + ks[kh]);
        r[2 * reg] = __float_as_uint(v.x);
        r[2 * reg + 1] = __float_as_uint(v.y);
      }
    }
}

template <bool XBF>
__device__ __forceinline__ void split_x(const uint32_t (&r)[8], uint32_t (&a)[3][4]) {
#pragma unroll
  for (int reg = 0; reg < 4; ++reg) {
    if constexpr (XBF) {
      a[0][reg] = r[reg];
    } else {
      const float f[2] = {__uint_as_float(r[2 * reg]), __uint_as_float(r[2 * reg + 1])};
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

// MT 16-row tiles × NT 8-column tiles per CTA; the 8 warps split K.
template <int MT, int NT, bool XBF>
__global__ void __launch_bounds__(32 * kMmaWarps) dense_mma_kernel(const uint16_t* w, int64_t K, int64_t rpg,
                                                                   int64_t blocks_per_group, const void* x, int64_t M,
                                                                   int64_t ldx, void* y, bool y_bf16, int64_t ldy,
                                                                   float alpha) {
  dev::pdl_wait_and_release();
  constexpr int kParts = XBF ? 1 : 3, kAcc = MT * NT * 4;
  __shared__ float red[kMmaWarps - 1][kAcc][32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t grp = blockIdx.x / blocks_per_group;
  const int64_t c0 = (blockIdx.x % blocks_per_group) * (8 * NT);  // the CTA's first column within its group
  const int64_t m0 = int64_t(blockIdx.y) * (16 * MT);
  const int64_t col0 = grp * K;                                   // the group's columns of x
  float acc[MT][NT][4];
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;
  const uint16_t* wrow[NT];
  bool wok[NT];
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    const int64_t cg = c0 + 8 * j + g;  // the B fragment's column n = g of tile j
    wok[j] = cg < rpg;
    wrow[j] = w + (grp * rpg + (wok[j] ? cg : 0)) * K;
  }
  // Warp w takes k16 steps w, w + 8, w + 16, …, U of them per round: the
  // round's weight and x loads are all issued before its first mma (one
  // step per round left every warp waiting a full memory latency per step;
  // at one token the loop was latency-bound, ~30 µs for 2 MB). The mma order
  // per warp is unchanged, so every bit is. Tall tiles (M > 16: prefill,
  // many CTAs, compute-bound) keep one step per round: the extra registers
  // of a deeper round halved their occupancy and slowed them (~30%, the
  // compressor projections at 2,048 rows). (16 steps per round for the narrow
  // one-token tiles was tried: 206 registers, and the same ~15 µs a call
  // under ncu, so the rounds are not what bounds it now.)
  constexpr int U = MT == 1 ? (NT == 1 ? 8 : 4) : 1;
  const int64_t steps = (K + 15) / 16;
  for (int64_t s0 = warp; s0 < steps; s0 += int64_t(kMmaWarps) * U) {
    uint32_t b[U][NT][2];
    uint32_t xr[U][MT][8];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t k = (s0 + int64_t(u) * kMmaWarps) * 16 + 2 * t;  // k >= K past the last step: zeros
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        b[u][j][0] = wok[j] && k < K ? *reinterpret_cast<const uint32_t*>(wrow[j] + k) : 0u;
        b[u][j][1] = wok[j] && k + 8 < K ? *reinterpret_cast<const uint32_t*>(wrow[j] + k + 8) : 0u;
      }
#pragma unroll
      for (int i = 0; i < MT; ++i) load_x<XBF>(x, ldx, col0, m0 + 16 * i + g, M, k, K, xr[u][i]);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (s0 + int64_t(u) * kMmaWarps >= steps) break;  // warp-uniform; no mma past the last step
#pragma unroll
      for (int i = 0; i < MT; ++i) {
        uint32_t a[3][4];
        split_x<XBF>(xr[u][i], a);
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
          for (int part = 0; part < kParts; ++part) sm90::mma_16816(acc[i][j], a[part], b[u][j][0], b[u][j][1]);
      }
    }
  }
  // The warps' partial sums, added in warp order by warp 0.
  if (warp > 0) {
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) red[warp - 1][(i * NT + j) * 4 + e][lane] = acc[i][j][e];
  }
  __syncthreads();
  if (warp != 0) return;
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float v = acc[i][j][e];
        for (int w2 = 0; w2 < kMmaWarps - 1; ++w2) v += red[w2][(i * NT + j) * 4 + e][lane];
        // c0, c1: row g, columns 2t, 2t+1; c2, c3: row g + 8.
        const int64_t row = m0 + 16 * i + g + (e >= 2 ? 8 : 0);
        const int64_t cg = c0 + 8 * j + 2 * t + (e & 1);
        if (row < M && cg < rpg) dev::store_out(y, y_bf16, row * ldy + grp * rpg + cg, v * alpha);
      }
}

template <int MT, int NT>
void launch_mma(Context& ctx, const uint16_t* w, int64_t N, int64_t K, int groups, const void* x, bool x_bf16,
                int64_t M, int64_t ldx, void* y, bool y_bf16, int64_t ldy, float alpha) {
  const int64_t rpg = N / groups, bpg = (rpg + 8 * NT - 1) / (8 * NT), blocks = int64_t(groups) * bpg;
  CM_CU_CHECK(blocks < (int64_t(1) << 31) && (M + 16 * MT - 1) / (16 * MT) < 65536,
              "dense_linear: grid too large (%lld columns, %lld rows)", (long long)N, (long long)M);
  const dim3 grid(unsigned(blocks), unsigned((M + 16 * MT - 1) / (16 * MT)));
  if (x_bf16)
    launch_kernel(ctx, dense_mma_kernel<MT, NT, true>, grid, dim3(32 * kMmaWarps), 0, "dense_mma_kernel", w, K, rpg,
                  bpg, x, M, ldx, y, y_bf16, ldy, alpha);
  else
    launch_kernel(ctx, dense_mma_kernel<MT, NT, false>, grid, dim3(32 * kMmaWarps), 0, "dense_mma_kernel", w, K, rpg,
                  bpg, x, M, ldx, y, y_bf16, ldy, alpha);
}

}  // namespace

bool dense_mma_supported(int64_t K, int64_t ldx, const void* x, bool x_bf16) {
  // 4-byte weight pairs and 8-byte (f32) / 4-byte (bf16) x pairs: K and ldx even, rows aligned.
  const uintptr_t align = x_bf16 ? 4 : 8;
  return K % 8 == 0 && ldx % 2 == 0 && reinterpret_cast<uintptr_t>(x) % align == 0;
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
