// Attention with sinks on the GPU (see ops/attention.h).
//
// One canonical algorithm per (token, head), so the bits never depend on the
// batch or the path that ran:
//  1. the candidates (window rows, then compressed entries: all causal ones or
//     the indexer's choice) are cut into fixed segments of kSeg;
//  2. per segment s: scores S = (q · e)·scale (−inf for a missing entry),
//     m_s = max S, l_s = Σ exp(S − m_s), o_s = Σ exp(S − m_s)·e (fp32), by the
//     same code in the same kernel whatever the path (segment_partial_*);
//  3. the segments merge in order 0, 1, 2, … into the sink state (m = sink,
//     l = 1, o = 0): m' = max(m, m_s), a = exp(m − m'), b = exp(m_s − m'),
//     o = o·a + o_s·b, l = l·a + l_s·b (merge_ml / merge_one);
//  4. out = o / l, inverse RoPE at the query position, bf16 (finish_pair).
// Two paths run exactly these operations:
//  - in-CTA (prefill, or no workspace): CTA (token, head group) walks the
//    segments, merging each into registers as it goes, then finishes;
//  - split (few tokens: decode): CTA (token, head group, segment) writes its
//    (m_s, l_s, o_s) to an fp32 workspace, and a combine kernel per (token,
//    heads) merges them in order from the sink state and finishes. At batch 1
//    V4-Flash CSA gets 4 head groups × 10 segments = 40 CTAs instead of 4.
// The merge and the finish exist in two kernels, so they are written with
// explicit round-to-nearest intrinsics: no FMA contraction the compiler could
// choose differently in each. Everything is fixed-order (no atomics).
//
// A CTA holds a group of up to 16 heads of q in shared memory and loads a
// segment's kSeg rows once for all of them (MQA: K = V). Step 2 runs on the
// tensor cores (attention_mma.cuh): the SIMT form spent ~11 TFLOP/s on what
// is two small GEMMs per segment (S = Q·Eᵀ: 16 × 64 × dim, o_s = P·E:
// 16 × dim × 64), 26% of a V4-Flash prefill step. The 16 × 64 scores stay in
// fp32 for m_s and l_s (a warp per head, fixed butterfly), and P enters the
// second GEMM as two bf16 parts, so o_s keeps ~fp32 accuracy. head_dim 8 (below
// one k16 step) keeps the SIMT form (segment_partial_simt), chosen by the
// shape alone: a warp per entry for the scores, a thread per (8 channels,
// heads) for the weighted sum. The head grouping is fixed by the head count,
// so any token's CTA always runs the same code on the same operands.
#include <algorithm>

#include "backend/cuda/attention/attention_mma.cuh"
#include "backend/cuda/core/cuda_util.h"
#include "backend/cuda/core/kernel_setup.h"
#include "backend/cuda/core/ops_device.cuh"
#include "ops/attention.h"
#include "ops/rope.h"

namespace cm {

namespace {

constexpr int kSeg = 64;           // candidates per segment: a constant of the algorithm, never derived from the step
constexpr int kMaxCtaHeads = 16;   // heads per CTA (fewer when heads has no such divisor)
constexpr int kThreads = 256;
constexpr int kMaxDim = 512;
constexpr int kMaxHp = 1;          // SIMT (dim 8 only): heads per thread
constexpr int kMaxSegZ = 65535;    // grid.z limit of the split path
constexpr int kMmaMinDim = 16;     // one k16 step: smaller heads take the SIMT segment
constexpr int kPS = kSeg + 8;      // tensor-core path: row stride of the scores and of P (bank spread)
static_assert(kThreads == 32 * cuda::attn::kMmaWarps && kSeg == 8 * cuda::attn::kMmaWarps,
              "the tensor-core path gives each warp 8 candidates of the segment");
static_assert(kMaxCtaHeads * (kMmaMinDim / 2 / 8) <= kThreads * kMaxHp, "SIMT: a thread per (head, 8 channels)");
static_assert(kMaxCtaHeads == cuda::attn::kMmaRows, "a head group is one 16-row mma tile");
static_assert(kMaxDim / 16 <= cuda::attn::kMaxPairs * cuda::attn::kMmaWarps, "P·E column pairs per warp");

// The segment step a head size takes (never the batch): tensor cores from one k16 step up.
bool mma_dim(int64_t dim) { return dim >= kMmaMinDim; }

struct AttnParams {
  AttnInputs in;
  const uint16_t* q;
  int heads, dim;  // heads: the CTA's share of total_heads
  float scale;
  const float* freqs;
  int rope_dim;
  float af;
  const int32_t* slot;
  const int32_t* pos;
  int64_t n;
  uint16_t* out;
  int hp;           // SIMT: heads per thread
  int total_heads;
  int split;        // 1: one segment per CTA (blockIdx.z) into the workspace
  int max_seg;      // segments per token in the workspace layout
};

// Workspace layout of the split path: o_s [n, max_seg, heads, dim], then
// (m_s, l_s) [n, max_seg, heads, 2].
__host__ __device__ inline int64_t ws_o_floats(int64_t n, int64_t max_seg, int64_t heads, int64_t dim) {
  return n * max_seg * heads * dim;
}

// Shared memory of attention_kernel<mma> (offsets stay multiples of 16
// bytes: dim % 8 == 0). Tensor cores: q and the tile padded by 8 elements a
// row (ldmatrix without bank conflicts), q always 16 rows (the mma tile),
// scores [16, kPS] fp32, P as two bf16 parts [16, kPS] each.
size_t attn_smem(int64_t heads, int64_t dim, bool mma) {
  if (!mma)
    return size_t(heads * dim) * 2 + size_t(kSeg * dim) * 2 + size_t(kSeg) * 8 + size_t(heads * kSeg) * 4 +
           size_t(2 * heads) * 4;
  const int64_t ts = dim + 8;
  return size_t(kMaxCtaHeads * ts) * 2 + size_t(kSeg * ts) * 2 + size_t(kSeg) * 8 + size_t(kMaxCtaHeads * kPS) * 4 +
         size_t(2 * kMaxCtaHeads * kPS) * 2 + size_t(2 * kMaxCtaHeads) * 4;
}

__device__ __forceinline__ void unpack8(const uint4& u, float (&f)[8]) {
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    f[2 * k] = __uint_as_float(w[k] << 16);
    f[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
  }
}

// Candidates of token (P, its position): window rows, then compressed entries.
__device__ __forceinline__ void candidate_counts(const AttnInputs& in, int64_t P, int64_t& n_win, int64_t& total) {
  n_win = min(P + 1, in.W);
  int64_t n_comp = 0;
  if (in.entries && in.ratio > 0) n_comp = in.sel ? in.topk : min((P + 1) / in.ratio, in.max_entries);
  total = n_win + n_comp;
}

// Step 3: folds a segment's (m_s, l_s) into the running (m, l); a, b rescale
// the running and the segment's sums. The sink keeps m finite, so an empty
// segment (m_s = −inf, l_s = 0, o_s = 0) gets b = 0 and leaves the state as is.
__device__ __forceinline__ void merge_ml(float& m, float& l, float ms, float ls, float& a, float& b) {
  const float mn = fmaxf(m, ms);
  a = expf(__fsub_rn(m, mn));
  b = expf(__fsub_rn(ms, mn));
  l = __fadd_rn(__fmul_rn(l, a), __fmul_rn(ls, b));
  m = mn;
}
__device__ __forceinline__ float merge_one(float o, float os, float a, float b) {
  return __fadd_rn(__fmul_rn(o, a), __fmul_rn(os, b));
}
__device__ __forceinline__ void merge_o(float (&o)[8], const float (&os)[8], float a, float b) {
#pragma unroll
  for (int k = 0; k < 8; ++k) o[k] = merge_one(o[k], os[k], a, b);
}

// Step 4 for channels ch, ch + 1 (ch even) of one head: o·inv (inv = 1 / l),
// inverse RoPE at P on the rope channels (the last rope_dim of the head), the
// bf16 pair as one word (lower channel in the low half). Every path finishes
// through this function, so the same o and l give the same bits.
__device__ __forceinline__ uint32_t finish_pair(float o0, float o1, float inv, int ch, const AttnParams& p,
                                                int64_t P) {
  float v0 = __fmul_rn(o0, inv), v1 = __fmul_rn(o1, inv);
  const int nope = p.dim - p.rope_dim;
  if (ch >= nope) cuda::dev::rope_pair_rn(v0, v1, p.freqs[(ch - nope) / 2], P, p.af, true);
  return uint32_t(cuda::dev::to_bf(v0)) | (uint32_t(cuda::dev::to_bf(v1)) << 16);
}

// Step 4 for channels [8c, 8c+8) of one head, to dst (the head's row).
__device__ __forceinline__ void finish_head(const float (&o)[8], float l, int c, const AttnParams& p, int64_t P,
                                            uint16_t* dst) {
  const float inv = __fdiv_rn(1.0f, l);
  uint32_t w[4];
#pragma unroll
  for (int u = 0; u < 4; ++u) w[u] = finish_pair(o[2 * u], o[2 * u + 1], inv, 8 * c + 2 * u, p, P);
  reinterpret_cast<uint4*>(dst)[c] = make_uint4(w[0], w[1], w[2], w[3]);
}

// Shared memory of attention_kernel (see attn_smem).
struct AttnSmem {
  uint16_t* qs;          // [H or 16, ts] this CTA's q
  uint16_t* tile;        // [kSeg, ts] the segment's rows
  const uint16_t** src;  // [kSeg] their rows (null = missing or past the segment's end)
  float* S;              // scores: SIMT [H, kSeg] (then exp(S − m_s)); mma [16, kPS]
  uint16_t* ph;          // mma: [16, kPS] bf16(p)
  uint16_t* pl;          // mma: [16, kPS] bf16(p − ph)
  float* ms;             // [H] m_s
  float* ls;             // [H] l_s
};

template <bool kMma>
__device__ __forceinline__ AttnSmem carve_smem(unsigned char* smem, int H, int D) {
  const int rows = kMma ? kMaxCtaHeads : H, ts = kMma ? D + 8 : D, ss = kMma ? kPS : kSeg;
  AttnSmem sm;
  sm.qs = reinterpret_cast<uint16_t*>(smem);
  sm.tile = sm.qs + rows * ts;
  sm.src = reinterpret_cast<const uint16_t**>(sm.tile + kSeg * ts);
  sm.S = reinterpret_cast<float*>(sm.src + kSeg);
  sm.ph = reinterpret_cast<uint16_t*>(sm.S + rows * ss);
  sm.pl = sm.ph + (kMma ? rows * kPS : 0);
  sm.ms = reinterpret_cast<float*>(sm.pl + (kMma ? rows * kPS : 0));
  sm.ls = sm.ms + H;
  return sm;
}

// Step 2, first part, for segment sg of token i (candidates [sg·kSeg, …)):
// the rows' pointers into sm.src and the rows into sm.tile (row stride ts);
// missing rows and the rows past the segment's end are zero, so every value
// the tensor cores read is finite. Starts with a barrier (the previous
// segment is consumed), ends with one. Returns the segment's length.
__device__ __forceinline__ int load_segment(const AttnParams& p, const AttnSmem& sm, int64_t i, int64_t P, int64_t s,
                                            int64_t n_win, int64_t total, int64_t sg, int ts) {
  const AttnInputs& in = p.in;
  const int D = p.dim, DT = D / 8;
  const int64_t s0 = sg * kSeg;
  const int len = int(min(int64_t(kSeg), total - s0));
  __syncthreads();
  if (threadIdx.x < kSeg) {
    const int64_t cidx = s0 + threadIdx.x;
    const uint16_t* ptr = nullptr;
    if (int(threadIdx.x) < len) {
      if (cidx < n_win) {
        // Position q's row: this step's KV row when the batch holds it, else the ring.
        const int64_t q = P - n_win + 1 + cidx, j = i - (P - q);
        if (j >= 0 && p.slot[j] == s && p.pos[j] == q)
          ptr = in.kv + j * D;
        else
          ptr = in.window + (s * in.W + q % in.W) * D;
      } else {
        const int64_t ci = cidx - n_win;
        const int64_t e = in.sel ? int64_t(in.sel[i * in.topk + ci]) : ci;
        if (e >= 0 && e < (P + 1) / in.ratio && e < in.max_entries) ptr = in.entries + (s * in.max_entries + e) * D;
      }
    }
    sm.src[threadIdx.x] = ptr;
  }
  __syncthreads();
  for (int k = threadIdx.x; k < kSeg * DT; k += blockDim.x) {
    const int e = k / DT, cc = k % DT;
    const uint16_t* sp = sm.src[e];
    uint4* dst = reinterpret_cast<uint4*>(sm.tile + e * ts) + cc;
    if (sp)
      cuda::attn::cp_async16(dst, reinterpret_cast<const uint4*>(sp) + cc);
    else
      *dst = make_uint4(0, 0, 0, 0);
  }
  cuda::attn::cp_async_wait_all();
  __syncthreads();
  return len;
}

// Step 2, segment softmax, a warp per head: lane l takes entries l and l + 32;
// m_s by the warp's max, l_s = the warp's butterfly sum of the lane pairs.
// SIMT: exp(S − m_s) back into S (entries < len); tensor cores: into ph + pl
// for all kSeg entries (0 past len, so nothing of the previous segment stays).
template <bool kMma>
__device__ __forceinline__ void segment_softmax(const AttnSmem& sm, int H, int len) {
  static_assert(kSeg == 64, "the segment softmax gives each lane two entries");
  constexpr int ss = kMma ? kPS : kSeg;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  for (int h = warp; h < H; h += nwarps) {
    float* Sh = sm.S + h * ss;
    const float s_lo = lane < len ? Sh[lane] : -INFINITY, s_hi = lane + 32 < len ? Sh[lane + 32] : -INFINITY;
    const float mx = cuda::dev::warp_max(fmaxf(s_lo, s_hi));
    const float mu = mx == -INFINITY ? 0.f : mx;  // all missing: every weight 0, no NaN
    const float p_lo = expf(__fsub_rn(s_lo, mu)), p_hi = expf(__fsub_rn(s_hi, mu));
    if constexpr (kMma) {
      const uint16_t hl = cuda::dev::to_bf(p_lo), hh = cuda::dev::to_bf(p_hi);
      sm.ph[h * kPS + lane] = hl;
      sm.ph[h * kPS + lane + 32] = hh;
      sm.pl[h * kPS + lane] = cuda::dev::to_bf(__fsub_rn(p_lo, cuda::dev::bf(hl)));
      sm.pl[h * kPS + lane + 32] = cuda::dev::to_bf(__fsub_rn(p_hi, cuda::dev::bf(hh)));
    } else {
      if (lane < len) Sh[lane] = p_lo;
      if (lane + 32 < len) Sh[lane + 32] = p_hi;
    }
    const float l = cuda::dev::warp_sum(__fadd_rn(p_lo, p_hi));
    if (lane == 0) {
      sm.ms[h] = mx;
      sm.ls[h] = l;
    }
  }
}

// Step 2 on the tensor cores for segment sg: fills sm.ms/ls and os = this
// warp's o_s fragments (attn::mma_pv: rows g, g + 8 of the 16-row tile;
// rows past the group's heads are 0). ms/ls stay valid until the next call.
__device__ __forceinline__ void segment_partial_mma(const AttnParams& p, const AttnSmem& sm, int64_t i, int64_t P,
                                                    int64_t s, int64_t n_win, int64_t total, int64_t sg,
                                                    float (&os)[cuda::attn::kMaxPairs][2][4]) {
  const int D = p.dim, ts = D + 8;
  const int len = load_segment(p, sm, i, P, s, n_win, total, sg, ts);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (8 * warp < len) {  // warps past the end: their scores are never read
    float sc[4];
    cuda::attn::mma_scores(sm.qs, ts, sm.tile, ts, D, warp, lane, sc);
    const int g = lane >> 2, e0 = 8 * warp + 2 * (lane & 3);
    const bool ok0 = sm.src[e0] != nullptr, ok1 = sm.src[e0 + 1] != nullptr;
#pragma unroll
    for (int r = 0; r < 2; ++r)
      *reinterpret_cast<float2*>(sm.S + (g + 8 * r) * kPS + e0) =
          make_float2(ok0 ? __fmul_rn(sc[2 * r], p.scale) : -INFINITY,
                      ok1 ? __fmul_rn(sc[2 * r + 1], p.scale) : -INFINITY);
  }
  __syncthreads();
  segment_softmax<true>(sm, p.heads, len);
  __syncthreads();
  cuda::attn::mma_pv(sm.ph, sm.pl, kPS, sm.tile, ts, D, (len + 15) / 16, warp, lane, os);
}

// Step 2 in SIMT form (head_dim below one k16 step) for segment sg: fills
// sm.ms/ls and each thread's os[hh][·] = o_s of channels [8c, 8c+8) of head
// hg·hp + hh. ms/ls stay valid until the next call.
__device__ __forceinline__ void segment_partial_simt(const AttnParams& p, const AttnSmem& sm, int64_t i, int64_t P,
                                                     int64_t s, int64_t n_win, int64_t total, int64_t sg, int c,
                                                     int hg, float (&os)[kMaxHp][8]) {
  const int H = p.heads, D = p.dim, DT = D / 8;
  const int len = load_segment(p, sm, i, P, s, n_win, total, sg, D);
  // Scores: a warp per entry, lane l sums channel chunks l and l + 32 (fixed
  // for a head whatever the grouping), then a butterfly sum over the warp.
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  for (int e = warp; e < len; e += nwarps) {
    float ea[2][8];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int cc = lane + 32 * j;
      if (cc < DT) unpack8(reinterpret_cast<const uint4*>(sm.tile + e * D)[cc], ea[j]);
    }
    const bool present = sm.src[e] != nullptr;
    // kScoreHeads heads at a time: independent chains the scheduler can
    // interleave (each head's own sum order is unchanged).
    constexpr int kScoreHeads = 4;
    for (int hb = 0; hb < H; hb += kScoreHeads) {
      float acc[kScoreHeads];
#pragma unroll
      for (int u = 0; u < kScoreHeads; ++u) {
        acc[u] = 0.f;
        const int h = hb + u;
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int cc = lane + 32 * j;
          if (h < H && cc < DT) {
            float qa[8];
            unpack8(reinterpret_cast<const uint4*>(sm.qs + h * D)[cc], qa);
#pragma unroll
            for (int k = 0; k < 8; ++k) acc[u] = __fmaf_rn(qa[k], ea[j][k], acc[u]);
          }
        }
      }
#pragma unroll
      for (int off = 16; off > 0; off >>= 1)
#pragma unroll
        for (int u = 0; u < kScoreHeads; ++u) acc[u] = __fadd_rn(acc[u], __shfl_xor_sync(0xffffffffu, acc[u], off));
      if (lane == 0)
#pragma unroll
        for (int u = 0; u < kScoreHeads; ++u)
          if (hb + u < H) sm.S[(hb + u) * kSeg + e] = present ? __fmul_rn(acc[u], p.scale) : -INFINITY;
    }
  }
  __syncthreads();
  segment_softmax<false>(sm, H, len);
  __syncthreads();
#pragma unroll
  for (int hh = 0; hh < kMaxHp; ++hh)
#pragma unroll
    for (int k = 0; k < 8; ++k) os[hh][k] = 0.f;
  for (int e = 0; e < len; ++e) {
    float ev[8];
    unpack8(reinterpret_cast<const uint4*>(sm.tile + e * D)[c], ev);
#pragma unroll
    for (int hh = 0; hh < kMaxHp; ++hh) {
      const int h = hg * p.hp + hh;
      if (hh < p.hp && h < H) {
        const float pe = sm.S[h * kSeg + e];
#pragma unroll
        for (int k = 0; k < 8; ++k) os[hh][k] = __fmaf_rn(pe, ev[k], os[hh][k]);
      }
    }
  }
}

// The workspace row of (token i, segment sg, head h0 + h) in the split path.
__device__ __forceinline__ int64_t ws_row(const AttnParams& p, int64_t i, int64_t sg, int64_t hh) {
  return (i * p.max_seg + sg) * p.total_heads + hh;
}

// attention_kernel's segments [sg0, sg1) and finish on the tensor cores: lane
// (g, t) of warp w holds rows g and g + 8 (heads h0 + row) of its column
// pairs (mma_pv's layout) for the whole walk.
__device__ __forceinline__ void attention_mma(const AttnParams& p, const AttnSmem& sm, int64_t i, int h0, int64_t P,
                                              int64_t s, int64_t n_win, int64_t total, int64_t sg0, int64_t sg1) {
  constexpr int kPairs = cuda::attn::kMaxPairs, kWarps = cuda::attn::kMmaWarps;
  const int H = p.heads, D = p.dim, DT = D / 8, ts = D + 8;
  {
    // q's 16 tile rows (zero past the group), P's rows past the group zero (the softmax never writes them).
    const uint4* qg = reinterpret_cast<const uint4*>(p.q + (i * p.total_heads + h0) * D);
    for (int k = threadIdx.x; k < kMaxCtaHeads * DT; k += blockDim.x) {
      const int r = k / DT, cc = k % DT;
      reinterpret_cast<uint4*>(sm.qs + r * ts)[cc] = r < H ? qg[r * DT + cc] : make_uint4(0, 0, 0, 0);
    }
    uint32_t* pz = reinterpret_cast<uint32_t*>(sm.ph);  // ph and pl are contiguous
    for (int k = threadIdx.x; k < kMaxCtaHeads * kPS; k += blockDim.x) pz[k] = 0u;
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  float m[2], l[2], o[kPairs][2][4], os[kPairs][2][4];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    m[r] = g + 8 * r < H ? p.in.sinks[h0 + g + 8 * r] : 0.f;
    l[r] = 1.0f;
  }
#pragma unroll
  for (int j = 0; j < kPairs; ++j)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf)
#pragma unroll
      for (int k = 0; k < 4; ++k) o[j][hf][k] = 0.f;
  for (int64_t sg = sg0; sg < sg1; ++sg) {
    segment_partial_mma(p, sm, i, P, s, n_win, total, sg, os);
    if (p.split) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = g + 8 * r;
        if (row >= H) continue;
        float* dst = p.in.workspace + ws_row(p, i, sg, h0 + row) * D;
#pragma unroll
        for (int j = 0; j < kPairs; ++j)
#pragma unroll
          for (int hf = 0; hf < 2; ++hf) {
            const int pr = warp + kWarps * j;
            if (16 * pr < D)
              *reinterpret_cast<float2*>(dst + 16 * pr + 8 * hf + 2 * t) =
                  make_float2(os[j][hf][2 * r], os[j][hf][2 * r + 1]);
          }
      }
      if (int(threadIdx.x) < H) {
        float* ml = p.in.workspace + ws_o_floats(p.n, p.max_seg, p.total_heads, D) +
                    2 * ws_row(p, i, sg, h0 + int(threadIdx.x));
        ml[0] = sm.ms[threadIdx.x];
        ml[1] = sm.ls[threadIdx.x];
      }
    } else {
      float a[2] = {0.f, 0.f}, b[2] = {0.f, 0.f};  // rows past the group: any finite value
#pragma unroll
      for (int r = 0; r < 2; ++r)
        if (g + 8 * r < H) merge_ml(m[r], l[r], sm.ms[g + 8 * r], sm.ls[g + 8 * r], a[r], b[r]);
#pragma unroll
      for (int j = 0; j < kPairs; ++j)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf)
#pragma unroll
          for (int k = 0; k < 4; ++k) o[j][hf][k] = merge_one(o[j][hf][k], os[j][hf][k], a[k >> 1], b[k >> 1]);
    }
  }
  if (p.split) return;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = g + 8 * r;
    if (row >= H) continue;
    const float inv = __fdiv_rn(1.0f, l[r]);
    uint16_t* dst = p.out + (i * p.total_heads + h0 + row) * D;
#pragma unroll
    for (int j = 0; j < kPairs; ++j)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int pr = warp + kWarps * j, ch = 16 * pr + 8 * hf + 2 * t;
        if (16 * pr < D)
          *reinterpret_cast<uint32_t*>(dst + ch) = finish_pair(o[j][hf][2 * r], o[j][hf][2 * r + 1], inv, ch, p, P);
      }
  }
}

// attention_kernel's segments [sg0, sg1) and finish in SIMT form: thread
// (hg, c) holds channels [8c, 8c+8) of heads hg·hp + hh.
__device__ __forceinline__ void attention_simt(const AttnParams& p, const AttnSmem& sm, int64_t i, int h0, int64_t P,
                                               int64_t s, int64_t n_win, int64_t total, int64_t sg0, int64_t sg1) {
  const int H = p.heads, D = p.dim, DT = D / 8;
  {
    const uint4* qg = reinterpret_cast<const uint4*>(p.q + (i * p.total_heads + h0) * D);
    uint4* q4 = reinterpret_cast<uint4*>(sm.qs);
    for (int k = threadIdx.x; k < H * DT; k += blockDim.x) q4[k] = qg[k];
  }
  const int c = threadIdx.x % DT, hg = threadIdx.x / DT;
  float o[kMaxHp][8], m[kMaxHp], l[kMaxHp];
#pragma unroll
  for (int hh = 0; hh < kMaxHp; ++hh) {
    const int h = hg * p.hp + hh;
    m[hh] = (hh < p.hp && h < H) ? p.in.sinks[h0 + h] : 0.f;
    l[hh] = 1.0f;
#pragma unroll
    for (int k = 0; k < 8; ++k) o[hh][k] = 0.f;
  }
  float os[kMaxHp][8];
  for (int64_t sg = sg0; sg < sg1; ++sg) {
    segment_partial_simt(p, sm, i, P, s, n_win, total, sg, c, hg, os);
#pragma unroll
    for (int hh = 0; hh < kMaxHp; ++hh) {
      const int h = hg * p.hp + hh;
      if (hh < p.hp && h < H) {
        if (p.split) {
          const int64_t row = ws_row(p, i, sg, h0 + h);
          float4* dst = reinterpret_cast<float4*>(p.in.workspace + row * D + 8 * c);
          dst[0] = make_float4(os[hh][0], os[hh][1], os[hh][2], os[hh][3]);
          dst[1] = make_float4(os[hh][4], os[hh][5], os[hh][6], os[hh][7]);
          if (c == 0) {
            float* ml = p.in.workspace + ws_o_floats(p.n, p.max_seg, p.total_heads, D) + 2 * row;
            ml[0] = sm.ms[h];
            ml[1] = sm.ls[h];
          }
        } else {
          float a, b;
          merge_ml(m[hh], l[hh], sm.ms[h], sm.ls[h], a, b);
          merge_o(o[hh], os[hh], a, b);
        }
      }
    }
  }
  if (p.split) return;
#pragma unroll
  for (int hh = 0; hh < kMaxHp; ++hh) {
    const int h = hg * p.hp + hh;
    if (hh < p.hp && h < H) finish_head(o[hh], l[hh], c, p, P, p.out + (i * p.total_heads + h0 + h) * D);
  }
}

// Grid (token, head group, segment in the split path). In-CTA: all segments
// merged in order, then finished. Split: segment blockIdx.z into the workspace.
// kMma: the tensor-core segment (mma_dim), else SIMT.
template <bool kMma>
__global__ void __launch_bounds__(kThreads, 2) attention_kernel(const AttnParams p) {
  cuda::dev::pdl_wait_and_release();
  extern __shared__ __align__(16) unsigned char smem[];
  const AttnSmem sm = carve_smem<kMma>(smem, p.heads, p.dim);
  const int64_t i = blockIdx.x;
  const int h0 = blockIdx.y * p.heads;  // this CTA's heads: [h0, h0 + heads) of p.total_heads
  const int64_t P = p.pos[i], s = p.slot[i];
  int64_t n_win, total;
  candidate_counts(p.in, P, n_win, total);
  const int64_t nseg = (total + kSeg - 1) / kSeg;
  const int64_t sg0 = p.split ? int64_t(blockIdx.z) : 0, sg1 = p.split ? sg0 + 1 : nseg;
  if (sg0 >= nseg) return;  // past this token's segments (the whole CTA, before any barrier)
  if constexpr (kMma)
    attention_mma(p, sm, i, h0, P, s, n_win, total, sg0, sg1);
  else
    attention_simt(p, sm, i, h0, P, s, n_win, total, sg0, sg1);
}

// Split path, second kernel: grid (token, heads / (blockDim/(dim/8))), a
// thread per (head, 8 channels). Every thread runs its head's (m, l) chain
// itself (the same values in each), so no barrier is needed.
__global__ void __launch_bounds__(kThreads) attention_combine_kernel(const AttnParams p) {
  cuda::dev::pdl_wait_and_release();
  const int D = p.dim, DT = D / 8;
  const int64_t i = blockIdx.x;
  const int h = int(blockIdx.y) * (int(blockDim.x) / DT) + int(threadIdx.x) / DT, c = int(threadIdx.x) % DT;
  if (h >= p.total_heads) return;
  const int64_t P = p.pos[i];
  int64_t n_win, total;
  candidate_counts(p.in, P, n_win, total);
  const int64_t nseg = (total + kSeg - 1) / kSeg;
  const float* ml = p.in.workspace + ws_o_floats(p.n, p.max_seg, p.total_heads, D);
  float m = p.in.sinks[h], l = 1.0f, o[8];
#pragma unroll
  for (int k = 0; k < 8; ++k) o[k] = 0.f;
  // Unrolled: the loads of later segments issue before this one's merge.
#pragma unroll 4
  for (int64_t sg = 0; sg < nseg; ++sg) {
    const int64_t row = (i * p.max_seg + sg) * p.total_heads + h;
    const float2 msl = *reinterpret_cast<const float2*>(ml + 2 * row);
    const float4* src = reinterpret_cast<const float4*>(p.in.workspace + row * D + 8 * c);
    const float4 u0 = src[0], u1 = src[1];
    const float os[8] = {u0.x, u0.y, u0.z, u0.w, u1.x, u1.y, u1.z, u1.w};
    float a, b;
    merge_ml(m, l, msl.x, msl.y, a, b);
    merge_o(o, os, a, b);
  }
  finish_head(o, l, c, p, P, p.out + (i * p.total_heads + h) * D);
}

__global__ void window_store_kernel(const uint16_t* kv, uint16_t* window, int64_t W, int64_t dim, const int32_t* slot,
                                    const int32_t* pos, int64_t n) {
  cuda::dev::pdl_wait_and_release();
  const int64_t i = blockIdx.x, s = slot[i];
  if (i + W < n && slot[i + W] == s) return;  // position p + W of this chunk takes the ring row
  uint16_t* dst = window + (s * W + pos[i] % W) * dim;
  for (int64_t k = threadIdx.x; k < dim; k += blockDim.x) dst[k] = kv[i * dim + k];
}

// Heads per CTA: the largest divisor of heads up to kMaxCtaHeads (per-head
// math does not depend on it; it bounds registers and shared memory).
int64_t cta_heads_of(int64_t heads) {
  int64_t g = std::min<int64_t>(heads, kMaxCtaHeads);
  while (heads % g) --g;
  return g;
}

// Upper bound of any token's candidates: the window plus the top-k (CSA) or
// every entry (HCA).
int64_t max_candidates_of(const AttnInputs& in) {
  return in.W + (in.entries ? (in.sel ? in.topk : in.max_entries) : 0);
}

int64_t segments_of(int64_t candidates) { return (candidates + kSeg - 1) / kSeg; }

}  // namespace

void setup_attention_kernels(int /*device*/) {
  // Each form's largest shape: the tensor cores take dim 16..512, SIMT dim 8.
  CM_CUDA(cudaFuncSetAttribute(attention_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               int(attn_smem(kMaxCtaHeads, kMaxDim, true))));
  CM_CUDA(cudaFuncSetAttribute(attention_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               int(attn_smem(kMaxCtaHeads, kMmaMinDim / 2, false))));
}

int64_t attention_split_floats(int64_t heads, int64_t dim, int64_t max_candidates, int64_t n) {
  return n * segments_of(max_candidates) * heads * (dim + 2);
}

bool attention_takes_split(const cuda::Context& ctx, const AttnInputs& in, int64_t heads, int64_t dim, int64_t n) {
  if (!in.workspace || n <= 0 || heads <= 0) return false;
  const int64_t max_seg = segments_of(max_candidates_of(in));
  const int64_t groups = heads / cta_heads_of(heads);
  // Splitting pays while the in-CTA grid leaves most SMs idle (decode); one
  // segment has nothing to split.
  return max_seg > 1 && max_seg <= kMaxSegZ && n * groups < 2 * int64_t(ctx.sm_count()) &&
         attention_split_floats(heads, dim, max_candidates_of(in), n) <= in.workspace_floats;
}

void attention_sink_cuda(cuda::Context& ctx, const AttnInputs& in, const uint16_t* q, int64_t heads, int64_t dim,
                         float scale, const RopeView& rope, const int32_t* slot, const int32_t* pos, int64_t n,
                         uint16_t* out) {
  CM_CU_CHECK(dim >= 8 && dim <= kMaxDim && (dim & (dim - 1)) == 0,
              "attention_sink_cuda: head_dim %lld unsupported (a power of two in [8, %d])", (long long)dim, kMaxDim);
  CM_CU_CHECK(heads > 0, "attention_sink_cuda: no heads");
  CM_CU_CHECK(rope.freqs && rope.rope_dim > 0 && rope.rope_dim % 8 == 0 && rope.rope_dim <= dim,
              "attention_sink_cuda: RoPE of %lld channels (needs a multiple of 8 within the head)",
              (long long)rope.rope_dim);
  CM_CU_CHECK(in.kv && in.window && in.W > 0 && in.sinks, "attention_sink_cuda: missing KV rows, window or sinks");
  CM_CU_CHECK(!in.entries || (in.ratio > 0 && in.max_entries > 0 && (!in.sel || in.topk > 0)),
              "attention_sink_cuda: compressed entries need a ratio, a capacity and (with a selection) its top-k");
  CM_CU_CHECK(in.workspace_floats >= 0 && (in.workspace || in.workspace_floats == 0),
              "attention_sink_cuda: workspace of %lld floats without a pointer", (long long)in.workspace_floats);
  if (n <= 0) return;
  CM_CU_CHECK(n < (int64_t(1) << 31), "attention_sink_cuda: %lld tokens exceed the grid", (long long)n);
  const int64_t cta_heads = cta_heads_of(heads);
  const int dt = int(dim / 8), hg = kThreads / dt, hp = int((cta_heads + hg - 1) / hg);
  const bool mma = mma_dim(dim);
  CM_CU_CHECK(mma || hp <= kMaxHp, "attention_sink_cuda: internal: %d heads per thread", hp);
  const size_t smem = attn_smem(cta_heads, dim, mma);
  CM_CU_CHECK(smem <= attn_smem(kMaxCtaHeads, mma ? kMaxDim : kMmaMinDim / 2, mma),
              "attention_sink_cuda: %zu bytes of shared memory needed", smem);
  const bool split = attention_takes_split(ctx, in, heads, dim, n);
  const int64_t max_seg = segments_of(max_candidates_of(in));
  AttnParams p{in, q, int(cta_heads), int(dim), scale, rope.freqs, int(rope.rope_dim), rope.attention_factor,
               slot, pos, n, out, hp, int(heads), split ? 1 : 0, int(split ? max_seg : 0)};
  const dim3 grid(unsigned(n), unsigned(heads / cta_heads), unsigned(split ? max_seg : 1));
  cuda::launch_kernel(ctx, mma ? attention_kernel<true> : attention_kernel<false>, grid, dim3(unsigned(kThreads)), smem,
                      "attention_kernel", p);
  if (!split) return;
  const int64_t combine_heads = std::min<int64_t>(heads, kThreads / dt);
  cuda::launch_kernel(ctx, attention_combine_kernel,
                      dim3(unsigned(n), unsigned((heads + combine_heads - 1) / combine_heads)),
                      dim3(unsigned(combine_heads * dt)), 0, "attention_combine_kernel", p);
}

void window_store_cuda(cuda::Context& ctx, const uint16_t* kv, uint16_t* window, int64_t W, int64_t dim,
                       const int32_t* slot, const int32_t* pos, int64_t n) {
  CM_CU_CHECK(W > 0 && dim > 0 && kv && window, "window_store_cuda: empty window or rows");
  if (n <= 0) return;
  cuda::launch_kernel(ctx, window_store_kernel, dim3(unsigned(n)), dim3(128), 0, "window_store_kernel", kv, window, W,
                      dim, slot, pos, n);
}

}  // namespace cm
