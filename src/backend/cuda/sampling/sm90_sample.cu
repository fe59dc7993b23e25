// Sampling rows of logits on the GPU (ops/sample.h), Hopper: one cluster of kCluster CTAs per row runs the
// CPU's steps (backend/cpu/sample.cpp). Each CTA copies its contiguous slice of the row into shared memory
// once, so every later pass (sum of exp, argmax, the integer weights, the radix selects, the draw) reads
// shared memory; the CTAs combine their partials through distributed shared memory in rank order.
//
// Why a cluster: a row is 129,280 logits and every filter needs a whole-row decision, so one CTA per row
// (the first version) left 131 of 132 SMs idle at batch 1 and spent 1.4 ms there. kCluster is fixed, never
// chosen by the batch: the float sums run in one order per vocabulary size (thread, warp, CTA rank), so a
// row's logprob has the same bits alone or among 255 others. The thresholds come from radix selects over
// the tokens' 32-bit integer weights, 8 bits a round, with per-warp shared-memory histograms of counts
// (top-k) or weight sums (top-p); integer sums do not depend on their order, so the kept set, the draw and
// the token are the CPU's bits.
#include <cooperative_groups.h>

#include <cfloat>
#include <climits>

#include "backend/cuda/core/cuda_util.h"
#include "backend/cuda/core/ops_device.cuh"
#include "common/error.h"
#include "ops/sample.h"
#include "ops/sample_math.h"

namespace cm {

namespace {

namespace cg = cooperative_groups;
namespace sm = sample_math;
constexpr int kCluster = 8;  // CTAs per row (portable cluster size)
constexpr int kThreads = 512, kWarps = kThreads / 32;
constexpr int64_t kMaxSlice = 44 * 1024;  // logits per CTA in shared memory (176 KiB beside ~37 KiB of Shared)

// One CTA's contribution to a cluster-wide reduction.
struct Part {
  unsigned long long u64a, u64b;
  float f32a, f32b;
  int32_t i32a, i32b;
};

struct Shared {
  unsigned long long hist[kWarps][256];  // per-warp radix histograms (no contention between warps)
  uint32_t lane_w[kWarps][32];           // a warp's weights of one pass, for its bins' leaders to sum
  unsigned long long merged[2][256];     // this CTA's histogram, read by its peers (double-buffered)
  Part part[2];                          // this CTA's partial, read by its peers (double-buffered)
  float top_v[kMaxSampleTopN];           // this CTA's raw top_n (read by rank 0; written once)
  int32_t top_i[kMaxSampleTopN];
  unsigned long long wu64[kWarps];
  float wf32[kWarps];
  int32_t wi32[kWarps];
  unsigned long long bcast_u64;
  float bcast_f32;
  int32_t bcast_i32;
  int32_t pick;
};

__device__ __forceinline__ bool allowed(const uint32_t* mask, int64_t i) {
  return !mask || (mask[i >> 5] >> (i & 31)) & 1u;
}

// --- CTA reductions in a fixed order (warp xor tree, then warp 0 over the warps in order); every thread
// gets the result.
template <class T, class Op>
__device__ T block_reduce(Shared& s, T v, T identity, T* slots, T* bcast, Op op) {
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();
  if ((threadIdx.x & 31) == 0) slots[threadIdx.x >> 5] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    T w = threadIdx.x < kWarps ? slots[threadIdx.x] : identity;
    for (int o = 16; o > 0; o >>= 1) w = op(w, __shfl_xor_sync(0xffffffffu, w, o));
    if (threadIdx.x == 0) *bcast = w;
  }
  __syncthreads();
  return *bcast;
}
__device__ float block_max(Shared& s, float v) {
  return block_reduce(s, v, -FLT_MAX * 2, s.wf32, &s.bcast_f32, [](float a, float b) { return fmaxf(a, b); });
}
__device__ float block_sum(Shared& s, float v) {
  return block_reduce(s, v, 0.0f, s.wf32, &s.bcast_f32, [](float a, float b) { return a + b; });
}
__device__ unsigned long long block_sum_u64(Shared& s, unsigned long long v) {
  return block_reduce(s, v, 0ull, s.wu64, &s.bcast_u64,
                      [](unsigned long long a, unsigned long long b) { return a + b; });
}

// The largest value, lowest id on ties (id INT_MAX: none).
__device__ void block_argmax(Shared& s, float& v, int32_t& id) {
  const auto better = [](float ov, int32_t oi, float v, int32_t id) { return ov > v || (ov == v && oi < id); };
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int32_t oi = __shfl_xor_sync(0xffffffffu, id, o);
    if (better(ov, oi, v, id)) v = ov, id = oi;
  }
  __syncthreads();
  if ((threadIdx.x & 31) == 0) s.wf32[threadIdx.x >> 5] = v, s.wi32[threadIdx.x >> 5] = id;
  __syncthreads();
  if (threadIdx.x < 32) {
    v = threadIdx.x < kWarps ? s.wf32[threadIdx.x] : -FLT_MAX * 2;
    id = threadIdx.x < kWarps ? s.wi32[threadIdx.x] : INT_MAX;
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, v, o);
      const int32_t oi = __shfl_xor_sync(0xffffffffu, id, o);
      if (better(ov, oi, v, id)) v = ov, id = oi;
    }
    if (threadIdx.x == 0) s.bcast_f32 = v, s.bcast_i32 = id;
  }
  __syncthreads();
  v = s.bcast_f32;
  id = s.bcast_i32;
}

// Exclusive prefix sum over the threads in thread order; *total gets the sum.
__device__ unsigned long long block_exclusive_scan(Shared& s, unsigned long long v, unsigned long long* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  unsigned long long inc = v;
  for (int o = 1; o < 32; o <<= 1) {
    const unsigned long long t = __shfl_up_sync(0xffffffffu, inc, o);
    if (lane >= o) inc += t;
  }
  __syncthreads();
  if (lane == 31) s.wu64[warp] = inc;
  __syncthreads();
  if (warp == 0) {
    const unsigned long long w = lane < kWarps ? s.wu64[lane] : 0;
    unsigned long long wi = w;
    for (int o = 1; o < 32; o <<= 1) {
      const unsigned long long t = __shfl_up_sync(0xffffffffu, wi, o);
      if (lane >= o) wi += t;
    }
    if (lane < kWarps) s.wu64[lane] = wi - w;  // exclusive over the warps
    if (lane == 31) s.bcast_u64 = wi;
  }
  __syncthreads();
  *total = s.bcast_u64;
  return s.wu64[warp] + inc - v;
}

// --- The cluster: publish this CTA's partial, wait for every peer's, read them in rank order. Buffers
// alternate with the publish count, so a buffer is rewritten only after a later cluster barrier, by
// which time every peer has read it.
struct Cluster {
  cg::cluster_group cl;
  int pub = 0;
  __device__ Cluster() : cl(cg::this_cluster()) {}
  __device__ unsigned rank() const { return cl.block_rank(); }

  // Every thread gets the kCluster partials (parts[r] = rank r's).
  __device__ void exchange(Shared& s, const Part& mine, Part (&parts)[kCluster]) {
    Part& slot = s.part[pub & 1];
    if (threadIdx.x == 0) slot = mine;
    cl.sync();
#pragma unroll
    for (int r = 0; r < kCluster; ++r) parts[r] = *cl.map_shared_rank(&slot, r);
    ++pub;
  }
};

// Radix select over the weights w >= floor_w of every CTA's slice: by_mass = false finds the goal-th
// largest weight, by_mass = true the largest t with sum(w >= t) >= goal. 4 rounds of 8 bits, most
// significant first; each round's histogram is the sum of the CTAs', bin by bin.
__device__ uint32_t radix_select(Shared& s, Cluster& c, const uint32_t* w, int64_t n, uint32_t floor_w,
                                 unsigned long long goal, bool by_mass) {
  const int tid = threadIdx.x, warp = tid >> 5;
  uint32_t prefix = 0, pmask = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = tid; b < kWarps * 256; b += kThreads) (&s.hist[0][0])[b] = 0;
    __syncthreads();
    // Most weights share a few bins (every token far below the top one lands in bin 0 of the first
    // round), so lanes of a warp that hit one bin are combined first and only the lowest of them adds:
    // a lone writer per bin and warp, no atomics and no serialised conflicts.
    const int lane = tid & 31;
    for (int64_t base = 0; base < n; base += kThreads) {
      const int64_t i = base + tid;
      const uint32_t v = i < n ? w[i] : 0u;
      const bool in = i < n && v >= floor_w && (v & pmask) == prefix;
      const uint32_t bin = in ? (v >> shift) & 255u : 256u;
      const unsigned peers = __match_any_sync(0xffffffffu, bin);
      const bool leader = in && lane == __ffs(peers) - 1;
      if (by_mass) {
        s.lane_w[warp][lane] = v;
        __syncwarp();
        if (leader) {
          unsigned long long sum = 0;
          for (unsigned m = peers; m; m &= m - 1) sum += s.lane_w[warp][__ffs(m) - 1];
          s.hist[warp][bin] += sum;
        }
      } else if (leader) {
        s.hist[warp][bin] += __popc(peers);
      }
      __syncwarp();  // this round's writes are seen by the next round's leaders (other lanes)
    }
    __syncthreads();
    unsigned long long* mine = s.merged[c.pub & 1];
    if (tid < 256) {
      unsigned long long h = 0;
      for (int k = 0; k < kWarps; ++k) h += s.hist[k][tid];
      mine[tid] = h;
    }
    c.cl.sync();  // every CTA's histogram is complete
    // bin b's count over the cluster, then the inclusive suffix sum over bins >= b (8 warps of 32 bins)
    unsigned long long h = 0;
    if (tid < 256)
      for (int r = 0; r < kCluster; ++r) h += c.cl.map_shared_rank(mine, r)[tid];
    ++c.pub;
    // the inclusive suffix sum over bins >= tid: within each of 8 warps from the high lanes down, then
    // plus the warps above
    unsigned long long inc = h;
    for (int o = 1; o < 32; o <<= 1) {
      const unsigned long long t = __shfl_down_sync(0xffffffffu, inc, o);
      if (lane + o < 32) inc += t;
    }
    if (tid < 256 && lane == 0) s.wu64[warp] = inc;  // bins 32 warp .. 32 warp + 31
    __syncthreads();
    if (tid < 256) {
      for (int k = warp + 1; k < 8; ++k) inc += s.wu64[k];
      // The CPU walks b from 255 down while hist[b] < goal, taking hist[b] off the goal: it stops at the
      // largest b >= 1 whose suffix reaches the goal, else at 0. Exactly one thread sees that it is b.
      const unsigned long long above = inc - h;
      const bool pick = tid == 0 ? above < goal : inc >= goal && (tid == 255 || above < goal);
      if (pick) s.pick = tid, s.bcast_u64 = goal - above;
    }
    __syncthreads();
    prefix |= uint32_t(s.pick) << shift;
    pmask |= 255u << shift;
    goal = s.bcast_u64;
    __syncthreads();  // s.pick and s.bcast_u64 are rewritten next round
  }
  return prefix;
}

// Copies x[0, n) into shared memory (16-byte loads when aligned), returning this thread's "a NaN or +inf
// is there" flag and its largest value.
__device__ void load_slice(const float* x, float* sx, int64_t n, int& bad, float& m) {
  const auto see = [&](float v) {
    bad |= isnan(v) || v == __int_as_float(0x7f800000);
    m = fmaxf(m, v);
  };
  int64_t head = 0;
  if ((reinterpret_cast<uintptr_t>(x) & 15) == 0) {
    const int64_t n4 = n / 4;
    const float4* x4 = reinterpret_cast<const float4*>(x);
    float4* s4 = reinterpret_cast<float4*>(sx);
    for (int64_t i = threadIdx.x; i < n4; i += kThreads) {
      const float4 v = x4[i];
      s4[i] = v;
      see(v.x), see(v.y), see(v.z), see(v.w);
    }
    head = n4 * 4;
  }
  for (int64_t i = head + threadIdx.x; i < n; i += kThreads) {
    const float v = x[i];
    sx[i] = v;
    see(v);
  }
}

// 2b. The raw top_n of the row (value descending, lowest id on ties): each CTA finds its own in top_n
// rounds of "the largest below the last one taken", then rank 0 merges the kCluster sorted lists and
// writes them with their raw logprobs.
__device__ void raw_top(Shared& s, Cluster& c, const SampleArgs& a, int64_t r, const float* sx, int64_t lo, int64_t n,
                        float m_raw, float s_raw) {
  const int tid = threadIdx.x;
  float pv = __int_as_float(0x7f800000);  // +inf: every finite logit is below it
  int32_t pi = -1;
  for (int k = 0; k < a.top_n; ++k) {
    float bv = -FLT_MAX * 2;
    int32_t bi = INT_MAX;
    for (int64_t i = tid; i < n; i += kThreads) {
      const float v = sx[i];
      const int32_t id = int32_t(lo + i);
      if ((v < pv || (v == pv && id > pi)) && (bi == INT_MAX || v > bv)) bv = v, bi = id;  // ids ascend
    }
    block_argmax(s, bv, bi);
    if (tid == 0) s.top_v[k] = bv, s.top_i[k] = bi;
    pv = bv, pi = bi;
  }
  c.cl.sync();  // every CTA's list is complete
  if (c.rank() != 0 || tid != 0) return;
  int head[kCluster] = {};
  for (int k = 0; k < a.top_n; ++k) {
    int q_best = -1;
    float bv = 0;
    int32_t bi = INT_MAX;
    for (int q = 0; q < kCluster; ++q) {
      if (head[q] >= a.top_n) continue;
      const int32_t id = c.cl.map_shared_rank(s.top_i, q)[head[q]];
      const float v = c.cl.map_shared_rank(s.top_v, q)[head[q]];
      if (id != INT_MAX && (q_best < 0 || v > bv || (v == bv && id < bi))) q_best = q, bv = v, bi = id;
    }
    a.top_id[r * a.top_n + k] = q_best < 0 ? -1 : bi;
    a.top_logprob[r * a.top_n + k] = q_best < 0 ? __int_as_float(0x7fc00000) : (bv - m_raw) - logf(s_raw);
    if (q_best >= 0) ++head[q_best];
  }
}

__global__ void __cluster_dims__(kCluster, 1, 1) __launch_bounds__(kThreads) sample_kernel(SampleArgs a) {
  cuda::dev::pdl_wait_and_release();
  __shared__ Shared s;
  extern __shared__ __align__(16) float sx[];  // this CTA's slice of the row, later its integer weights
  uint32_t* sw = reinterpret_cast<uint32_t*>(sx);
  Cluster c;
  Part parts[kCluster];
  const int tid = threadIdx.x;
  const int64_t r = blockIdx.x / kCluster, V = a.vocab, S = (V + kCluster - 1) / kCluster;
  const int64_t lo = min(V, int64_t(c.rank()) * S), n = min(V, lo + S) - lo;
  float* x = a.logits + r * V;  // the whole row (adjustments are written back to it)
  const SampleParams p = a.params[r];
  const uint32_t* mask = a.mask ? a.mask + r * a.mask_words : nullptr;
  int32_t token = -1, status = kSampleOk;
  float bv_best = 0;  // the largest allowed adjusted logit

  // 1-2. non-finite check, the raw distribution's max and sum of exp
  int bad = 0;
  float m_raw = -FLT_MAX * 2;  // -inf
  load_slice(x + lo, sx, n, bad, m_raw);
  {
    Part mine{};
    mine.i32a = __syncthreads_or(bad);
    mine.f32a = block_max(s, m_raw);
    c.exchange(s, mine, parts);
    bad = 0;
    m_raw = parts[0].f32a;
    for (int k = 0; k < kCluster; ++k) bad |= parts[k].i32a, m_raw = fmaxf(m_raw, parts[k].f32a);
  }
  float s_raw = 0;
  if (bad) {
    status = kSampleNonFinite;
  } else {
    float e = 0;
    for (int64_t i = tid; i < n; i += kThreads) e += expf(sx[i] - m_raw);
    Part mine{};
    mine.f32a = block_sum(s, e);
    c.exchange(s, mine, parts);
    for (int k = 0; k < kCluster; ++k) s_raw += parts[k].f32a;  // rank order
    if (a.top_n > 0) raw_top(s, c, a, r, sx, lo, n, m_raw, s_raw);

    // 3. adjustments of this slice's ids, in shared memory and written back to the row (distinct ids:
    // no two threads write one logit)
    const int64_t a0 = a.adj_offsets ? a.adj_offsets[r] : 0, n_adj = a.adj_offsets ? a.adj_offsets[r + 1] - a0 : 0;
    for (int64_t j = tid; j < n_adj; j += kThreads) {
      SampleAdjust& ad = a.adj[a0 + j];
      if (ad.id < lo || ad.id >= lo + n) continue;  // another CTA's (the host checks ids are inside the row)
      const float orig = sx[ad.id - lo];
      ad.orig = orig;
      float v = sm::add_rn(orig, ad.bias);
      if (ad.count > 0) {
        if (p.repetition_penalty != 1.0f)
          v = v > 0 ? sm::div_rn(v, p.repetition_penalty) : sm::mul_rn(v, p.repetition_penalty);
        v = sm::sub_rn(v, sm::add_rn(sm::mul_rn(float(ad.count), p.frequency_penalty), p.presence_penalty));
      }
      sx[ad.id - lo] = v;
      x[ad.id] = v;
    }
    __syncthreads();

    // 4-5. the largest allowed adjusted logit, lowest id on ties
    float bv = -FLT_MAX * 2;
    int32_t bi = INT_MAX;
    for (int64_t i = tid; i < n; i += kThreads) {
      const float v = sx[i];
      if (allowed(mask, lo + i) && v > bv) bv = v, bi = int32_t(lo + i);
    }
    block_argmax(s, bv, bi);
    Part best{};
    best.f32a = bv, best.i32a = bi;
    c.exchange(s, best, parts);
    for (int k = 0; k < kCluster; ++k)
      if (parts[k].f32a > bv || (parts[k].f32a == bv && parts[k].i32a < bi)) bv = parts[k].f32a, bi = parts[k].i32a;
    if (bi == INT_MAX || isinf(bv)) status = bi == INT_MAX ? kSampleNothingAllowed : kSampleNonFinite;
    token = bi;
    bv_best = bv;
  }

  if (status == kSampleOk && p.temperature != 0.0f) {
    // 6. the integer weights, in place of the slice, and the thresholds over them
    const float m = bv_best, t = p.temperature;
    for (int64_t i = tid; i < n; i += kThreads) sw[i] = allowed(mask, lo + i) ? sm::weight(sx[i], m, t) : 0u;
    __syncthreads();
    uint32_t thr = 1;
    if (p.top_k > 0 && p.top_k < V) thr = max(thr, radix_select(s, c, sw, n, 0, uint64_t(p.top_k), false));
    if (p.top_p < 1.0f) {
      unsigned long long z = 0;
      for (int64_t i = tid; i < n; i += kThreads) z += sw[i] >= thr ? sw[i] : 0u;
      Part mine{};
      mine.u64a = block_sum_u64(s, z);
      c.exchange(s, mine, parts);
      z = 0;
      for (int k = 0; k < kCluster; ++k) z += parts[k].u64a;
      const unsigned long long target = (unsigned long long)ceil(double(p.top_p) * double(z));
      thr = max(thr, radix_select(s, c, sw, n, thr, target, true));
    }
    if (p.min_p > 0.0f) thr = max(thr, uint32_t(ceil(double(p.min_p) * 2147483648.0)));
    // 7. the draw: the kept mass of each CTA (its place in rank order), then, in the CTA holding the
    // draw, each thread's contiguous run of ids and a scan to find the run holding it
    const int64_t run = (n + kThreads - 1) / kThreads, i0 = min(n, tid * run), i1 = min(n, i0 + run);
    unsigned long long kept = 0;
    for (int64_t i = i0; i < i1; ++i) kept += sw[i] >= thr ? sw[i] : 0u;
    unsigned long long cta_kept = 0;
    const unsigned long long before_me = block_exclusive_scan(s, kept, &cta_kept);
    Part mine{};
    mine.u64a = cta_kept;
    c.exchange(s, mine, parts);
    unsigned long long z = 0, before_cta = 0;
    for (int k = 0; k < kCluster; ++k) {
      if (k < int(c.rank())) before_cta += parts[k].u64a;
      z += parts[k].u64a;
    }
    const unsigned long long draw = sm::scale_draw(sm::philox_u64(p.seed, p.counter), z);
    token = -1;  // only the CTA holding the draw knows the token
    if (draw >= before_cta && draw < before_cta + cta_kept) {
      if (tid == 0) s.bcast_i32 = -1;
      __syncthreads();
      const unsigned long long b0 = before_cta + before_me;
      if (draw >= b0 && draw < b0 + kept) {
        unsigned long long acc = b0;
        for (int64_t i = i0; i < i1; ++i) {
          if (sw[i] < thr) continue;
          acc += sw[i];
          if (acc > draw) {
            s.bcast_i32 = int32_t(lo + i);
            break;
          }
        }
      }
      __syncthreads();
      token = s.bcast_i32;
    }
  }

  // Out, from the CTA owning the token (rank 0 when there is none): the chosen token's raw logit is an
  // adjusted id's original, else the row's value (which only adjustments overwrite).
  const bool owner = status == kSampleOk ? token >= lo && token < lo + n : c.rank() == 0;
  if (owner && token >= 0 && status == kSampleOk) {
    if (tid == 0) s.bcast_f32 = x[token];
    __syncthreads();
    const int64_t a0 = a.adj_offsets ? a.adj_offsets[r] : 0, n_adj = a.adj_offsets ? a.adj_offsets[r + 1] - a0 : 0;
    for (int64_t j = tid; j < n_adj; j += kThreads)
      if (a.adj[a0 + j].id == token) s.bcast_f32 = a.adj[a0 + j].orig;
    __syncthreads();
  }
  if (bad && a.top_n > 0 && c.rank() == 0)
    for (int k = tid; k < a.top_n; k += kThreads) a.top_id[r * a.top_n + k] = -1, a.top_logprob[r * a.top_n + k] = __int_as_float(0x7fc00000);
  if (owner && tid == 0) {
    const bool ok = status == kSampleOk;
    a.token[r] = ok ? token : -1;
    a.logprob[r] = ok ? (s.bcast_f32 - m_raw) - logf(s_raw) : __int_as_float(0x7fc00000);
    a.status[r] = status;
  }
  c.cl.sync();  // no CTA leaves while a peer may still read its shared memory
}

}  // namespace

int64_t sample_rows_cuda_max_vocab() { return kCluster * kMaxSlice; }

void sample_rows_cuda(cuda::Context& ctx, const SampleArgs& a) {
  CM_CU_CHECK(a.rows >= 0 && a.vocab > 0 && a.vocab <= sample_rows_cuda_max_vocab(),
              "sample_rows_cuda: %lld rows of vocabulary %lld (the device sampler takes at most %lld ids)",
              (long long)a.rows, (long long)a.vocab, (long long)sample_rows_cuda_max_vocab());
  CM_CU_CHECK(!a.mask || a.mask_words * 32 >= a.vocab, "sample_rows_cuda: %lld mask words for a vocabulary of %lld",
              (long long)a.mask_words, (long long)a.vocab);
  CM_CU_CHECK(a.logits && a.params && a.token && a.logprob && a.status && !a.adj == !a.adj_offsets,
              "sample_rows_cuda: a null array");
  CM_CU_CHECK(a.top_n >= 0 && a.top_n <= kMaxSampleTopN && (a.top_n == 0 || (a.top_id && a.top_logprob)),
              "sample_rows_cuda: top_n %d must be in [0, %d] with its output arrays", a.top_n, kMaxSampleTopN);
  CM_CU_CHECK(a.rows * kCluster < (int64_t(1) << 31), "sample_rows_cuda: %lld rows exceed the grid", (long long)a.rows);
  if (a.rows == 0) return;
  // per device, so set on every call (no stream work, a few microseconds of host time)
  CM_CUDA(cudaFuncSetAttribute(sample_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kMaxSlice * 4)));
  const int64_t slice = (a.vocab + kCluster - 1) / kCluster;
  cuda::launch_kernel(ctx, sample_kernel, dim3(unsigned(a.rows * kCluster)), dim3(kThreads), size_t(slice) * 4,
                      "sample_kernel", a);
}

}  // namespace cm
