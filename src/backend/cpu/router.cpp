#include <cmath>
#include <vector>

#include "ops/compressor.h"
#include "ops/router.h"

namespace cm {

namespace {
// PyTorch softplus (beta 1, threshold 20).
inline float softplus(float v) { return v > 20.0f ? v : std::log1p(std::exp(v)); }
}  // namespace

void route_cpu(const RouterParams& p, const int32_t* tokens, const float* logits, int64_t T, int32_t* idx,
               float* weights) {
  const int64_t E = p.experts, K = p.topk;
  std::vector<float> s(static_cast<size_t>(E)), biased(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t e = 0; e < E; ++e) s[size_t(e)] = std::sqrt(softplus(logits[t * E + e]));
    std::vector<int32_t> sel;
    if (p.tid2eid) {
      sel.assign(p.tid2eid + int64_t(tokens[t]) * K, p.tid2eid + int64_t(tokens[t]) * K + K);
    } else {
      for (int64_t e = 0; e < E; ++e) biased[size_t(e)] = s[size_t(e)] + p.bias[e];
      sel = topk_lower_index_first(biased.data(), E, K);
    }
    float sum = 0;
    for (int32_t e : sel) sum += s[size_t(e)];
    for (int64_t j = 0; j < K; ++j) {
      idx[t * K + j] = sel[size_t(j)];
      weights[t * K + j] = s[size_t(sel[size_t(j)])] / (sum + 1e-20f) * p.routed_scaling;
    }
  }
}

}  // namespace cm
