// The MoE block of one layer over a step's rows: router, routed experts, shared expert.
//
//   l = x·gateᵀ (fp32), s = sqrt(softplus(l))
//   hash layers: experts = tid2eid[token];  score layers: top-k of s + bias
//   (ties: lower expert id first); weights w = s_sel / Σ s_sel · routed_scaling
//   expert(x) = w2 · (silu(min(x·w1ᵀ, L)) ⊙ clamp(x·w3ᵀ, −L, L))
//   out = Σ_k w_k expert_k(x) + shared(x)
// Expert ids are global (0 … E−1) throughout. The step's rows are grouped per
// expert so each expert's weights are read once per step; every row adds its
// experts in ascending id order, so its sum does not depend on the batch.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/error.h"
#include "model/cpu_backend.h"
#include "ops/compressor.h"

namespace cm {

namespace {

// PyTorch softplus (beta 1, threshold 20).
inline float softplus(float v) { return v > 20.0f ? v : std::log1p(std::exp(v)); }
inline float silu(float v) { return v / (1.0f + std::exp(-v)); }

constexpr int64_t kMaxExperts = 4096;

// y = w2 · act(w1·x, w3·x) for n rows of x (g, up: [n, I] scratch).
void expert_forward(CpuBackend& be, const ExpertWeights& e, float limit, const float* x, int64_t n, float* g, float* up,
                    float* y) {
  const int64_t I = e.w1.out_features;
  be.linear(e.w1, x, n, g);
  be.linear(e.w3, x, n, up);
#pragma omp parallel for schedule(static) if (n * I >= (int64_t(1) << 15))
  for (int64_t j = 0; j < n * I; ++j) {
    float gv = g[j], uv = up[j];
    if (limit > 0) {
      gv = std::min(gv, limit);
      uv = std::min(std::max(uv, -limit), limit);
    }
    g[j] = silu(gv) * uv;
  }
  be.linear(e.w2, g, n, y);
}

}  // namespace

void moe_route(const Config& c, const LayerWeights& lw, const int32_t* tokens, const float* logits, int64_t T,
               int32_t* idx, float* weights) {
  const int64_t E = c.n_routed_experts, K = c.n_experts_per_tok;
  CM_CHECK(E <= kMaxExperts, "router: {} experts above {}", E, kMaxExperts);
  const bool hash = !lw.tid2eid.empty();
  float s[kMaxExperts], biased[kMaxExperts];
  int32_t order[kMaxExperts], sel[kMaxExperts];
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t e = 0; e < E; ++e) s[e] = std::sqrt(softplus(logits[t * E + e]));
    if (hash) {
      std::copy(&lw.tid2eid[size_t(int64_t(tokens[t]) * K)], &lw.tid2eid[size_t(int64_t(tokens[t]) * K + K)], sel);
    } else {
      for (int64_t e = 0; e < E; ++e) biased[e] = s[e] + lw.gate_bias[size_t(e)];
      topk_lower_index_first(biased, E, K, order, sel);
    }
    float sum = 0;
    for (int64_t j = 0; j < K; ++j) sum += s[sel[j]];
    for (int64_t j = 0; j < K; ++j) {
      idx[t * K + j] = sel[j];
      weights[t * K + j] = s[sel[j]] / (sum + 1e-20f) * float(c.routed_scaling_factor);
    }
  }
}

void moe_block(CpuBackend& be, int64_t L, const float* x, float* out) {
  const Config& c = be.model().config;
  const LayerWeights& lw = be.model().weights.layers[size_t(L)];
  const Batch& b = be.batch();
  CpuActivations& a = be.act();
  const int64_t N = b.n, D = c.hidden_size, E = c.n_routed_experts, K = c.n_experts_per_tok;

  be.linear(lw.gate, x, N, a.router.data());
  be.note("router_logits", L, a.router.data(), E, {E});
  moe_route(c, lw, b.token, a.router.data(), N, a.eidx.data(), a.ew.data());

  // Rows grouped by expert (counting sort, rows ascending within an expert).
  std::fill(a.ecount.begin(), a.ecount.begin() + E, 0);
  for (int64_t i = 0; i < N * K; ++i) a.ecount[size_t(a.eidx[size_t(i)])]++;
  a.estart[0] = 0;
  for (int64_t e = 0; e < E; ++e) a.estart[size_t(e + 1)] = a.estart[size_t(e)] + a.ecount[size_t(e)];
  std::copy(a.estart.begin(), a.estart.begin() + E, a.ecount.begin());  // fill cursors
  for (int64_t t = 0; t < N; ++t)
    for (int64_t j = 0; j < K; ++j) {
      const int32_t e = a.eidx[size_t(t * K + j)];
      const int32_t at = a.ecount[size_t(e)]++;
      a.erow[size_t(at)] = int32_t(t);
      a.eweight[size_t(at)] = a.ew[size_t(t * K + j)];
    }

  float* routed = a.routed.data();
  std::fill(routed, routed + N * D, 0.0f);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = a.estart[size_t(e)], n = a.estart[size_t(e + 1)] - r0;
    if (n == 0) continue;
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(a.xs.data() + i * D, x + int64_t(a.erow[size_t(r0 + i)]) * D, size_t(D) * 4);
    expert_forward(be, lw.experts[size_t(e)], c.swiglu_limit, a.xs.data(), n, a.g.data(), a.up.data(), a.y.data());
    for (int64_t i = 0; i < n; ++i) {
      float* o = routed + int64_t(a.erow[size_t(r0 + i)]) * D;
      const float wv = a.eweight[size_t(r0 + i)];
      const float* y = a.y.data() + i * D;
      for (int64_t d = 0; d < D; ++d) o[d] += wv * y[d];
    }
  }
  be.note("moe_routed", L, routed, D, {D});
  if (lw.has_shared) {
    expert_forward(be, lw.shared, c.swiglu_limit, x, N, a.g.data(), a.up.data(), a.y.data());
    be.note("moe_shared", L, a.y.data(), D, {D});
    for (int64_t i = 0; i < N * D; ++i) out[i] = routed[i] + a.y[size_t(i)];
  } else {
    std::memcpy(out, routed, size_t(N * D) * 4);
  }
}

}  // namespace cm
