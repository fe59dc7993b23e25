// Lightning-indexer scores and the deterministic top-k on the GPU (see
// ops/compressor.h).
// scores: grid (tokens, tiles of 16 entries), 128 threads: thread (e, g) dots
//         entry e of the tile with the heads g, g + 8, … (heads/8 of them), q
//         staged in shared memory as bf16 and the key tile as f32; the 8
//         group partial sums are added in group order (no atomics). (Tiles of
//         32 with 16 heads per thread left a decode token's ~1,000 entries to
//         32 CTAs doing long serial loops.)
// top-k:  one CTA of 1024 threads per row. The scores map to order-preserving
//         u32 keys; a 4-pass 8-bit radix select (integer histograms) finds the
//         k-th largest key T; every key > T is taken, and of the keys == T the
//         lowest indices (an in-order block scan); the k winners are then
//         bitonic-sorted on (key, ~index), i.e. score desc, index asc.
#include "backend/cuda/core/cuda_util.h"
#include "backend/cuda/core/ops_device.cuh"
#include "ops/compressor.h"

namespace cm {

namespace {

constexpr int kTile = 16;                 // entries per CTA
constexpr int kGroups = 128 / kTile;      // head groups per entry (8 threads per entry)
constexpr int kMaxHeads = 64, kMaxDim = 128;
constexpr int kMaxHp = kMaxHeads / kGroups;  // heads per thread

struct ScoreParams {
  CompressorStateView keys;
  const uint16_t* q;
  const float* w;
  int heads;
  int dim;
  const int32_t* slot;
  const int32_t* pos;
  float* score;
  int64_t ld;
};

__global__ void __launch_bounds__(128) indexer_scores_kernel(const ScoreParams p) {
  cuda::dev::pdl_wait_and_release();
  __shared__ uint16_t qs[kMaxHeads * kMaxDim];
  __shared__ float ks[kTile][kMaxDim + 1];
  __shared__ float part[kGroups][kTile];
  const int64_t i = blockIdx.x;
  const int64_t s = p.slot[i];
  const int64_t ncausal = min(int64_t(p.pos[i] + 1) / p.keys.ratio, min(p.keys.max_entries, p.ld));
  const int64_t e0 = int64_t(blockIdx.y) * kTile;
  if (e0 >= ncausal || s < 0 || s >= p.keys.max_slots) return;
  const int H = p.heads, D = p.dim;
  for (int k = threadIdx.x; k < H * D; k += blockDim.x) qs[k] = p.q[i * H * D + k];
  const uint16_t* kb = p.keys.entries + (s * p.keys.max_entries + e0) * D;
  const int ne = int(min(int64_t(kTile), ncausal - e0));
  for (int k = threadIdx.x; k < kTile * D; k += blockDim.x) {
    const int e = k / D, d = k % D;
    ks[e][d] = e < ne ? cuda::dev::bf(kb[int64_t(e) * D + d]) : 0.f;
  }
  __syncthreads();
  // Thread (e, g): entry e, heads g, g + kGroups, g + 2·kGroups, … (H / kGroups of them, in that order).
  const int e = threadIdx.x % kTile, g = threadIdx.x / kTile, hp = (H + kGroups - 1) / kGroups;
  const float qscale = 1.0f / sqrtf(float(D));
  float acc[kMaxHp];
#pragma unroll
  for (int h = 0; h < kMaxHp; ++h) acc[h] = 0.f;
  for (int d = 0; d < D; ++d) {
    const float kv = ks[e][d];
#pragma unroll
    for (int h = 0; h < kMaxHp; ++h)
      if (h < hp && g + kGroups * h < H) acc[h] += cuda::dev::bf(qs[(g + kGroups * h) * D + d]) * kv;
  }
  float sum = 0.f;
#pragma unroll
  for (int h = 0; h < kMaxHp; ++h)
    if (h < hp && g + kGroups * h < H) sum += fmaxf(acc[h], 0.f) * qscale * p.w[i * H + g + kGroups * h];
  part[g][e] = sum;
  __syncthreads();
  if (threadIdx.x < kTile && e < ne) {
    float v = part[0][e];
    for (int gg = 1; gg < kGroups; ++gg) v += part[gg][e];
    p.score[i * p.ld + e0 + e] = v;
  }
}

// ---- top-k ----

constexpr int kTopkThreads = 1024;
constexpr int kMaxK = 2048;

// Order-preserving key: larger float -> larger key; -0 = +0; NaN lowest.
__device__ __forceinline__ uint32_t fkey(float f) {
  if (f != f) return 0u;
  if (f == 0.f) f = 0.f;
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__global__ void __launch_bounds__(kTopkThreads) topk_kernel(const float* score, int64_t ld, const int32_t* pos,
                                                            int64_t ratio, int k, int32_t* idx) {
  cuda::dev::pdl_wait_and_release();
  __shared__ int hist[256];
  __shared__ int tmp[33];
  __shared__ uint32_t sh_prefix;
  __shared__ int sh_remaining, sh_ngt;
  __shared__ unsigned long long sel[kMaxK];
  const int64_t r = blockIdx.x;
  const float* sc = score + r * ld;
  const int64_t cnt = min(int64_t(pos[r] + 1) / ratio, ld);
  const int kk = int(min(int64_t(k), cnt));
  int P = 1;
  while (P < kk) P <<= 1;
  for (int j = threadIdx.x; j < P; j += blockDim.x) sel[j] = 0ull;
  __syncthreads();
  auto pack = [](uint32_t key, int64_t e) {
    return (static_cast<unsigned long long>(key) << 32) | (0xffffffffu - uint32_t(e));
  };
  if (cnt <= k) {
    for (int64_t e = threadIdx.x; e < cnt; e += blockDim.x) sel[e] = pack(fkey(sc[e]), e);
  } else {
    // Radix select of the kk-th largest key, 8 bits per pass from the top.
    uint32_t prefix = 0, mask = 0;
    int remaining = kk;
    for (int shift = 24; shift >= 0; shift -= 8) {
      for (int j = threadIdx.x; j < 256; j += blockDim.x) hist[j] = 0;
      __syncthreads();
      for (int64_t e = threadIdx.x; e < cnt; e += blockDim.x) {
        const uint32_t key = fkey(sc[e]);
        if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1);
      }
      __syncthreads();
      if (threadIdx.x < 32) {
        // The highest digit d whose bins d..255 hold >= remaining keys, with acc the
        // count above d: lane l scans bins 255 - 8l … 248 - 8l, a warp scan adds
        // the lanes above it (instead of one thread walking the 256 bins).
        const int lane = threadIdx.x;
        int c[8], local = 0;
#pragma unroll
        for (int j = 0; j < 8; ++j) local += (c[j] = hist[255 - 8 * lane - j]);
        int incl = local;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
          const int v = __shfl_up_sync(0xffffffffu, incl, o);
          if (lane >= o) incl += v;
        }
        const int excl = incl - local;
        const unsigned hit = __ballot_sync(0xffffffffu, excl < remaining && remaining <= incl);
        // No lane holds it only when fewer keys match than remain (not for a consistent
        // histogram): digit 0, as the serial walk ended.
        const int owner = hit ? __ffs(hit) - 1 : 31;
        if (lane == owner) {
          int acc = excl, d = 255 - 8 * lane;
#pragma unroll
          for (int j = 0; j < 8; ++j, --d) {
            if (d == 0 || acc + c[j] >= remaining) break;
            acc += c[j];
          }
          sh_prefix = prefix | (uint32_t(d) << shift);
          sh_remaining = remaining - acc;
        }
      }
      __syncthreads();
      prefix = sh_prefix;
      remaining = sh_remaining;
      mask |= 255u << shift;
      __syncthreads();
    }
    // prefix = T; take every key > T (any slot order), then the first
    // `remaining` keys == T by index.
    if (threadIdx.x == 0) sh_ngt = 0;
    __syncthreads();
    const int ngt = kk - remaining;
    int base_eq = 0;
    for (int64_t e0 = 0; e0 < cnt; e0 += blockDim.x) {
      const int64_t e = e0 + threadIdx.x;
      const uint32_t key = e < cnt ? fkey(sc[e]) : 0u;
      const bool gt = e < cnt && key > prefix, eq = e < cnt && key == prefix;
      if (gt) sel[atomicAdd(&sh_ngt, 1)] = pack(key, e);
      int total = 0;
      const int rank = cuda::dev::block_excl_scan(eq ? 1 : 0, tmp, total);
      if (eq && base_eq + rank < remaining) sel[ngt + base_eq + rank] = pack(key, e);
      base_eq += total;
    }
  }
  __syncthreads();
  // Bitonic sort of sel[0:P], descending.
  for (int size = 2; size <= P; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int t = threadIdx.x; t < P / 2; t += blockDim.x) {
        const int lo = 2 * stride * (t / stride) + (t % stride), hi = lo + stride;
        const bool desc = ((lo & size) == 0);
        const unsigned long long a = sel[lo], b = sel[hi];
        if ((a < b) == desc) {
          sel[lo] = b;
          sel[hi] = a;
        }
      }
      __syncthreads();
    }
  }
  for (int j = threadIdx.x; j < k; j += blockDim.x)
    idx[r * k + j] = j < kk ? int32_t(0xffffffffu - uint32_t(sel[j] & 0xffffffffull)) : -1;
}

}  // namespace

void indexer_scores_cuda(cuda::Context& ctx, const CompressorStateView& keys, const uint16_t* q, const float* w,
                         int64_t heads, const int32_t* slot, const int32_t* pos, int64_t n, int64_t max_causal,
                         float* score, int64_t ld) {
  CM_CU_CHECK(heads > 0 && heads <= kMaxHeads && heads % 4 == 0,
              "indexer_scores_cuda: %lld heads (the GPU kernel takes multiples of 4 up to %d)", (long long)heads,
              kMaxHeads);
  CM_CU_CHECK(keys.dc > 0 && keys.dc <= kMaxDim && keys.dc % 8 == 0,
              "indexer_scores_cuda: key width %lld (multiples of 8 up to %d)", (long long)keys.dc, kMaxDim);
  CM_CU_CHECK(keys.entries && keys.ratio > 0 && ld > 0, "indexer_scores_cuda: no key buffer, ratio or score row length");
  if (n <= 0 || max_causal <= 0) return;
  const int64_t tiles = (std::min(max_causal, std::min(keys.max_entries, ld)) + kTile - 1) / kTile;
  CM_CU_CHECK(n < (int64_t(1) << 31) && tiles < 65536, "indexer_scores_cuda: grid too large (%lld x %lld)",
              (long long)n, (long long)tiles);
  ScoreParams p{keys, q, w, int(heads), int(keys.dc), slot, pos, score, ld};
  cuda::launch_kernel(ctx, indexer_scores_kernel, dim3(unsigned(n), unsigned(tiles)), dim3(128), 0,
                      "indexer_scores_kernel", p);
}

void topk_lower_index_first_cuda(cuda::Context& ctx, const float* score, int64_t ld, const int32_t* pos,
                                 int64_t ratio, int64_t rows, int64_t k, int32_t* idx) {
  CM_CU_CHECK(k > 0 && k <= kMaxK, "topk_cuda: k = %lld outside [1, %d]", (long long)k, kMaxK);
  CM_CU_CHECK(ratio > 0 && ld > 0, "topk_cuda: ratio and row length must be positive");
  if (rows <= 0) return;
  CM_CU_CHECK(rows < (int64_t(1) << 31), "topk_cuda: %lld rows exceed the grid", (long long)rows);
  cuda::launch_kernel(ctx, topk_kernel, dim3(unsigned(rows)), dim3(kTopkThreads), 0, "topk_kernel", score, ld, pos,
                      ratio, int(k), idx);
}

}  // namespace cm
