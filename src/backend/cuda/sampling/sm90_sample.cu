// Sampling rows of logits on the GPU (ops/sample.h): one CTA of 1024 threads per row runs the CPU's
// steps (backend/cpu/sample.cpp) over the row in passes. The thresholds come from radix selects over
// the tokens' 32-bit integer weights, 8 bits per round, with shared-memory histograms of counts (top-k)
// or of weight sums (top-p); integer atomics add in any order to the same sum, so the kept set, the
// draw and the token are the CPU's bits. The raw logprob's float sum runs in this CTA's fixed order.
#include <cfloat>
#include <climits>

#include "backend/cuda/core/cuda_util.h"
#include "backend/cuda/core/ops_device.cuh"
#include "common/error.h"
#include "ops/sample.h"
#include "ops/sample_math.h"

namespace cm {

namespace {

namespace sm = sample_math;
constexpr int kThreads = 1024, kWarps = kThreads / 32;

struct Shared {
  unsigned long long hist[256];
  unsigned long long u64[kWarps];
  float f32[kWarps];
  int32_t i32[kWarps];
  unsigned long long bcast_u64;
  float bcast_f32;
  int32_t bcast_i32;
  uint32_t prefix;
};

__device__ __forceinline__ bool allowed(const uint32_t* mask, int64_t i) {
  return !mask || (mask[i >> 5] >> (i & 31)) & 1u;
}

// Block reductions in a fixed order (warp xor tree, then warp 0 over the warps' results in order);
// every thread gets the result.
__device__ float block_max(Shared& s, float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();
  if ((threadIdx.x & 31) == 0) s.f32[threadIdx.x >> 5] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    float w = s.f32[threadIdx.x];
    for (int o = 16; o > 0; o >>= 1) w = fmaxf(w, __shfl_xor_sync(0xffffffffu, w, o));
    if (threadIdx.x == 0) s.bcast_f32 = w;
  }
  __syncthreads();
  return s.bcast_f32;
}

__device__ float block_sum(Shared& s, float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) s.f32[threadIdx.x >> 5] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    float w = s.f32[threadIdx.x];
    for (int o = 16; o > 0; o >>= 1) w += __shfl_xor_sync(0xffffffffu, w, o);
    if (threadIdx.x == 0) s.bcast_f32 = w;
  }
  __syncthreads();
  return s.bcast_f32;
}

__device__ unsigned long long block_sum_u64(Shared& s, unsigned long long v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) s.u64[threadIdx.x >> 5] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    unsigned long long w = s.u64[threadIdx.x];
    for (int o = 16; o > 0; o >>= 1) w += __shfl_xor_sync(0xffffffffu, w, o);
    if (threadIdx.x == 0) s.bcast_u64 = w;
  }
  __syncthreads();
  return s.bcast_u64;
}

// The largest value, lowest id on ties (id INT_MAX: none).
__device__ int32_t block_argmax(Shared& s, float v, int32_t id) {
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int32_t oi = __shfl_xor_sync(0xffffffffu, id, o);
    if (ov > v || (ov == v && oi < id)) v = ov, id = oi;
  }
  __syncthreads();
  if ((threadIdx.x & 31) == 0) s.f32[threadIdx.x >> 5] = v, s.i32[threadIdx.x >> 5] = id;
  __syncthreads();
  if (threadIdx.x < 32) {
    v = s.f32[threadIdx.x];
    id = s.i32[threadIdx.x];
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, v, o);
      const int32_t oi = __shfl_xor_sync(0xffffffffu, id, o);
      if (ov > v || (ov == v && oi < id)) v = ov, id = oi;
    }
    if (threadIdx.x == 0) s.bcast_i32 = id;
  }
  __syncthreads();
  return s.bcast_i32;
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
  if (lane == 31) s.u64[warp] = inc;
  __syncthreads();
  if (warp == 0) {
    unsigned long long w = s.u64[lane], wi = w;
    for (int o = 1; o < 32; o <<= 1) {
      const unsigned long long t = __shfl_up_sync(0xffffffffu, wi, o);
      if (lane >= o) wi += t;
    }
    s.u64[lane] = wi - w;  // exclusive over the warps
    if (lane == 31) s.bcast_u64 = wi;
  }
  __syncthreads();
  *total = s.bcast_u64;
  return s.u64[warp] + inc - v;
}

// The token weight of id i (0 when masked).
__device__ __forceinline__ uint32_t weight_of(const float* x, const uint32_t* mask, int64_t i, float m, float t) {
  return allowed(mask, i) ? sm::weight(x[i], m, t) : 0u;
}

// Radix select over the weights w >= floor_w: by_mass = false finds the k-th largest weight (k = goal),
// by_mass = true the largest t with sum(w >= t) >= goal. 4 rounds of 8 bits, most significant first.
__device__ uint32_t radix_select(Shared& s, const float* x, const uint32_t* mask, int64_t V, float m, float t,
                                 uint32_t floor_w, unsigned long long goal, bool by_mass) {
  uint32_t prefix = 0, pmask = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += kThreads) s.hist[b] = 0;
    __syncthreads();
    for (int64_t i = threadIdx.x; i < V; i += kThreads) {
      const uint32_t w = weight_of(x, mask, i, m, t);
      if (w >= floor_w && (w & pmask) == prefix) atomicAdd(&s.hist[(w >> shift) & 255u], by_mass ? w : 1ull);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int b = 255;
      for (; b > 0 && s.hist[b] < goal; --b) goal -= s.hist[b];
      s.prefix = prefix | (uint32_t(b) << shift);
      s.bcast_u64 = goal;
    }
    __syncthreads();
    prefix = s.prefix;
    goal = s.bcast_u64;
    pmask |= 255u << shift;
  }
  return prefix;
}

__global__ void __launch_bounds__(kThreads) sample_kernel(SampleArgs a) {
  cuda::dev::pdl_wait_and_release();
  __shared__ Shared s;
  const int64_t r = blockIdx.x, V = a.vocab;
  float* x = a.logits + r * V;
  const SampleParams p = a.params[r];
  const uint32_t* mask = a.mask ? a.mask + r * a.mask_words : nullptr;
  const int tid = threadIdx.x;

  // 1-2. non-finite check, the raw distribution's max and sum of exp
  float m_raw = -FLT_MAX * 2;  // -inf
  int bad = 0;
  for (int64_t i = tid; i < V; i += kThreads) {
    const float v = x[i];
    bad |= isnan(v) || v == __int_as_float(0x7f800000);
    m_raw = fmaxf(m_raw, v);
  }
  if (__syncthreads_or(bad)) {
    if (tid == 0) a.token[r] = -1, a.logprob[r] = __int_as_float(0x7fc00000), a.status[r] = kSampleNonFinite;
    return;
  }
  m_raw = block_max(s, m_raw);
  float e = 0;
  for (int64_t i = tid; i < V; i += kThreads) e += expf(x[i] - m_raw);
  const float s_raw = block_sum(s, e);

  // 3. adjustments in place (distinct ids: no two threads write one logit)
  const int64_t a0 = a.adj_offsets ? a.adj_offsets[r] : 0, n_adj = a.adj_offsets ? a.adj_offsets[r + 1] - a0 : 0;
  for (int64_t j = tid; j < n_adj; j += kThreads) {
    SampleAdjust& ad = a.adj[a0 + j];
    if (ad.id < 0 || ad.id >= V) continue;  // the host checks ids (sample_rows_cpu throws); never write outside
    const float orig = x[ad.id];
    ad.orig = orig;
    float v = sm::add_rn(orig, ad.bias);
    if (ad.count > 0) {
      if (p.repetition_penalty != 1.0f)
        v = v > 0 ? sm::div_rn(v, p.repetition_penalty) : sm::mul_rn(v, p.repetition_penalty);
      v = sm::sub_rn(v, sm::add_rn(sm::mul_rn(float(ad.count), p.frequency_penalty), p.presence_penalty));
    }
    x[ad.id] = v;
  }
  __syncthreads();

  // 4-5. the largest allowed adjusted logit, lowest id on ties
  float bv = -FLT_MAX * 2;
  int32_t bi = INT_MAX;
  for (int64_t i = tid; i < V; i += kThreads) {
    const float v = x[i];
    if (allowed(mask, i) && v > bv) bv = v, bi = int32_t(i);
  }
  const int32_t best = block_argmax(s, bv, bi);
  if (best == INT_MAX || isinf(x[best])) {
    if (tid == 0)
      a.token[r] = -1, a.logprob[r] = __int_as_float(0x7fc00000),
      a.status[r] = best == INT_MAX ? kSampleNothingAllowed : kSampleNonFinite;
    return;
  }
  int32_t token = best;
  if (p.temperature != 0.0f) {
    // 6. thresholds over the integer weights
    const float m = x[best], t = p.temperature;
    uint32_t thr = 1;
    if (p.top_k > 0 && p.top_k < V) thr = max(thr, radix_select(s, x, mask, V, m, t, 0, uint64_t(p.top_k), false));
    if (p.top_p < 1.0f) {
      unsigned long long z = 0;
      for (int64_t i = tid; i < V; i += kThreads) {
        const uint32_t w = weight_of(x, mask, i, m, t);
        if (w >= thr) z += w;
      }
      z = block_sum_u64(s, z);
      const unsigned long long target = (unsigned long long)ceil(double(p.top_p) * double(z));
      thr = max(thr, radix_select(s, x, mask, V, m, t, thr, target, true));
    }
    if (p.min_p > 0.0f) thr = max(thr, uint32_t(ceil(double(p.min_p) * 2147483648.0)));
    // 7. the draw: each thread sums a contiguous run of ids, a scan finds the run holding it
    const int64_t run = (V + kThreads - 1) / kThreads, i0 = min(V, tid * run), i1 = min(V, i0 + run);
    unsigned long long mine = 0, z = 0;
    for (int64_t i = i0; i < i1; ++i) {
      const uint32_t w = weight_of(x, mask, i, m, t);
      if (w >= thr) mine += w;
    }
    const unsigned long long before = block_exclusive_scan(s, mine, &z);
    const unsigned long long draw = sm::scale_draw(sm::philox_u64(p.seed, p.counter), z);
    if (draw >= before && draw < before + mine) {
      unsigned long long acc = before;
      for (int64_t i = i0; i < i1; ++i) {
        const uint32_t w = weight_of(x, mask, i, m, t);
        if (w < thr) continue;
        acc += w;
        if (acc > draw) {
          s.bcast_i32 = int32_t(i);
          break;
        }
      }
    }
    __syncthreads();
    token = s.bcast_i32;
  }
  // the chosen token's raw logit: an adjusted id's original
  __syncthreads();
  if (tid == 0) s.bcast_f32 = x[token];
  __syncthreads();
  for (int64_t j = tid; j < n_adj; j += kThreads)
    if (a.adj[a0 + j].id == token) s.bcast_f32 = a.adj[a0 + j].orig;
  __syncthreads();
  if (tid == 0) {
    a.token[r] = token;
    a.logprob[r] = (s.bcast_f32 - m_raw) - logf(s_raw);
    a.status[r] = kSampleOk;
  }
}

}  // namespace

void sample_rows_cuda(cuda::Context& ctx, const SampleArgs& a) {
  CM_CU_CHECK(a.rows >= 0 && a.vocab > 0 && a.vocab < (int64_t(1) << 31), "sample_rows_cuda: %lld rows of vocabulary %lld",
              (long long)a.rows, (long long)a.vocab);
  CM_CU_CHECK(!a.mask || a.mask_words * 32 >= a.vocab, "sample_rows_cuda: %lld mask words for a vocabulary of %lld",
              (long long)a.mask_words, (long long)a.vocab);
  CM_CU_CHECK(a.logits && a.params && a.token && a.logprob && a.status && !a.adj == !a.adj_offsets,
              "sample_rows_cuda: a null array");
  CM_CU_CHECK(a.rows < (int64_t(1) << 31), "sample_rows_cuda: %lld rows exceed the grid", (long long)a.rows);
  if (a.rows == 0) return;
  cuda::launch_kernel(ctx, sample_kernel, dim3(unsigned(a.rows)), dim3(kThreads), 0, "sample_kernel", a);
}

}  // namespace cm
