#include <algorithm>
#include <cmath>

#include "common/error.h"
#include "ops/compressor.h"
#include "ops/router.h"

namespace cm {

namespace {
// PyTorch softplus (beta 1, threshold 20).
inline float softplus(float v) { return v > 20.0f ? v : std::log1p(std::exp(v)); }
}  // namespace

// Allocation-free (a model step calls it): per-token arrays on the stack.
void route_cpu(const RouterParams& p, const int32_t* tokens, const float* logits, int64_t T, int32_t* idx,
               float* weights) {
  constexpr int64_t kMaxExperts = 4096;
  const int64_t E = p.experts, K = p.topk;
  CM_CHECK(E <= kMaxExperts && K <= E, "router: {} experts (top-{}) outside the supported {}", E, K, kMaxExperts);
  float s[kMaxExperts], biased[kMaxExperts];
  int32_t order[kMaxExperts], sel[kMaxExperts];
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t e = 0; e < E; ++e) s[e] = std::sqrt(softplus(logits[t * E + e]));
    if (p.tid2eid) {
      std::copy(p.tid2eid + int64_t(tokens[t]) * K, p.tid2eid + int64_t(tokens[t]) * K + K, sel);
    } else {
      for (int64_t e = 0; e < E; ++e) biased[e] = s[e] + p.bias[e];
      topk_lower_index_first(biased, E, K, order, sel);
    }
    float sum = 0;
    for (int64_t j = 0; j < K; ++j) sum += s[sel[j]];
    for (int64_t j = 0; j < K; ++j) {
      idx[t * K + j] = sel[j];
      weights[t * K + j] = s[sel[j]] / (sum + 1e-20f) * p.routed_scaling;
    }
  }
}

}  // namespace cm
