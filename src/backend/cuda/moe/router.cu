// MoE router on the GPU (see ops/router.h): one warp per token. Each lane
// holds E/32 scores; top-k is k rounds of a warp arg-max on (value desc, id
// asc), so ties go to the lower expert id as on the CPU. Lane 0 sums the
// selected scores in selection order (the CPU's order).
#include "backend/cuda/core/cuda_util.h"
#include "backend/cuda/core/ops_device.cuh"
#include "ops/router.h"

namespace cm {

namespace {

constexpr int kMaxPerLane = 32;  // experts <= 1024

struct RouteK {
  int E, K;
  float scaling;
  const float* bias;
  const int32_t* tid2eid;
  int64_t vocab;
  const int32_t* tokens;
  const float* logits;
  int64_t T;
  int32_t* idx;
  float* w;
};

__device__ __forceinline__ float sqrt_softplus(float v) { return sqrtf(v > 20.0f ? v : log1pf(expf(v))); }

// A NaN logit is read as -inf (the step has counted it; here it only must not
// win the arg-max or poison the weights): what a separate replace_nan pass
// over the logits did, without its launch.
__device__ __forceinline__ float logit(const float* l, int e) {
  const float v = l[e];
  return v != v ? -INFINITY : v;
}

__global__ void route_kernel(const RouteK p) {
  cuda::dev::pdl_wait_and_release();
  const int lane = threadIdx.x & 31;
  const int64_t t = int64_t(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (t >= p.T) return;
  const float* l = p.logits + t * p.E;
  int32_t* idx = p.idx + t * p.K;
  float* w = p.w + t * p.K;
  float sel_s[32];  // lane 0: scores of the selected experts, in order
  if (p.tid2eid) {
    const int32_t tok = p.tokens[t];
    const bool ok = tok >= 0 && tok < p.vocab;
    if (lane == 0)
      for (int k = 0; k < p.K; ++k) {
        const int32_t e = ok ? p.tid2eid[int64_t(tok) * p.K + k] : -1;
        idx[k] = e;
        sel_s[k] = (e >= 0 && e < p.E) ? sqrt_softplus(logit(l, e)) : __int_as_float(0x7fc00000);
      }
  } else {
    float b[kMaxPerLane];
    uint32_t taken = 0;
    const int per = (p.E + 31) / 32;
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) {
      const int e = lane + 32 * i;
      const float v = (i < per && e < p.E) ? sqrt_softplus(logit(l, e)) + p.bias[e] : -INFINITY;
      b[i] = v != v ? -INFINITY : v;  // NaN ranks last, so the arg-max below always finds an expert
      if (!(i < per && e < p.E)) taken |= 1u << i;
    }
    for (int k = 0; k < p.K; ++k) {
      float bv = -INFINITY;
      int be = 0x7fffffff;
#pragma unroll
      for (int i = 0; i < kMaxPerLane; ++i) {
        const int e = lane + 32 * i;
        if (!(taken >> i & 1u) && (b[i] > bv || (b[i] == bv && e < be))) {
          bv = b[i];
          be = e;
        }
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int oe = __shfl_xor_sync(0xffffffffu, be, o);
        if (ov > bv || (ov == bv && oe < be)) {
          bv = ov;
          be = oe;
        }
      }
      if (be >= p.E) be = 0;  // unreachable with finite-or-(-inf) scores; never index past the row
      if ((be & 31) == lane) taken |= 1u << (be >> 5);
      if (lane == 0) {
        idx[k] = be;
        sel_s[k] = sqrt_softplus(logit(l, be));
      }
    }
  }
  if (lane == 0) {
    float sum = 0.f;
    for (int k = 0; k < p.K; ++k) sum += sel_s[k];
    for (int k = 0; k < p.K; ++k) w[k] = sel_s[k] / (sum + 1e-20f) * p.scaling;
  }
}

}  // namespace

void route_cuda(cuda::Context& ctx, const RouterParams& p, const int32_t* tokens, const float* logits, int64_t T,
                int32_t* idx, float* weights) {
  CM_CU_CHECK(p.experts > 0 && p.experts <= 32 * kMaxPerLane, "route_cuda: %lld experts (GPU router takes 1..1024)",
              (long long)p.experts);
  CM_CU_CHECK(p.topk > 0 && p.topk <= 32 && p.topk <= p.experts, "route_cuda: top-k %lld outside [1, min(32, %lld)]",
              (long long)p.topk, (long long)p.experts);
  CM_CU_CHECK(p.tid2eid ? (tokens != nullptr && p.vocab > 0) : p.bias != nullptr,
              "route_cuda: a hash layer needs tid2eid, token ids and the vocabulary size; a score layer needs the bias");
  if (T <= 0) return;
  RouteK k{int(p.experts), int(p.topk), p.routed_scaling, p.bias, p.tid2eid, p.vocab, tokens, logits, T, idx, weights};
  const unsigned blocks = unsigned((T + 3) / 4);
  cuda::launch_kernel(ctx, route_kernel, dim3(blocks), dim3(128), 0, "route_kernel", k);
}

}  // namespace cm
