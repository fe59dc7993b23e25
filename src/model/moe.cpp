// The MoE block of one layer (spec §7): router, routed experts, shared expert.
//
//   l = x·gateᵀ (fp32), s = sqrt(softplus(l))
//   hash layers: experts = tid2eid[token];  score layers: top-k of s + bias
//   (ties: lower expert id first); weights w = s_sel / Σ s_sel · routed_scaling
//   expert(x) = w2 · (silu(min(x·w1ᵀ, L)) ⊙ clamp(x·w3ᵀ, −L, L))
//   out = Σ_k w_k expert_k(x) + shared(x)
// Expert ids are global (0 … E−1) throughout. Tokens are grouped per expert so
// each expert's weights are read once per chunk.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/error.h"
#include "model/model.h"
#include "ops/router.h"
#include "ops/swiglu.h"

namespace cm {

namespace {

// Adds weight[i] · expert(x[rows[i]]) to out[rows[i]] for the given rows.
void expert_apply(const ExpertWeights& e, float limit, const float* x, int64_t D, const std::vector<int32_t>& rows,
                  const std::vector<float>& weight, float* out, ActQuant aq) {
  const int64_t n = int64_t(rows.size()), I = e.w1.out_features;
  if (n == 0) return;
  std::vector<float> xs(size_t(n * D)), g(size_t(n * I)), u(size_t(n * I)), y(size_t(n * D));
  for (int64_t i = 0; i < n; ++i) std::memcpy(&xs[size_t(i * D)], x + int64_t(rows[size_t(i)]) * D, size_t(D) * 4);
  linear_cpu(e.w1, xs.data(), n, g.data(), aq);
  linear_cpu(e.w3, xs.data(), n, u.data(), aq);
  swiglu_cpu(g.data(), u.data(), int64_t(g.size()), limit, g.data());
  linear_cpu(e.w2, g.data(), n, y.data(), aq);
  for (int64_t i = 0; i < n; ++i) {
    float* o = out + int64_t(rows[size_t(i)]) * D;
    const float wv = weight[size_t(i)];
    for (int64_t d = 0; d < D; ++d) o[d] += wv * y[size_t(i * D + d)];
  }
}

}  // namespace

void moe_route(const Config& c, const LayerWeights& lw, const int32_t* tokens, const float* logits, int64_t T,
               std::vector<int32_t>* idx, std::vector<float>* weights) {
  RouterParams p;
  p.experts = c.n_routed_experts;
  p.topk = c.n_experts_per_tok;
  p.routed_scaling = float(c.routed_scaling_factor);
  p.bias = lw.gate_bias.empty() ? nullptr : lw.gate_bias.data();
  p.tid2eid = lw.tid2eid.empty() ? nullptr : lw.tid2eid.data();
  p.vocab = c.vocab_size;
  idx->assign(size_t(T * p.topk), 0);
  weights->assign(size_t(T * p.topk), 0.0f);
  route_cpu(p, tokens, logits, T, idx->data(), weights->data());
}

void moe_block(const Model& mdl, int64_t L, const int32_t* tokens, const float* x, int64_t T, float* out,
               const ForwardOptions& opt) {
  const Config& c = mdl.config;
  const LayerWeights& lw = mdl.weights.layers[size_t(L)];
  const int64_t D = c.hidden_size, E = c.n_routed_experts, K = c.n_experts_per_tok;

  std::vector<float> logits(size_t(T * E));
  linear_cpu(lw.gate, x, T, logits.data(), opt.act_quant);
  std::vector<int32_t> idx;
  std::vector<float> wk;
  moe_route(c, lw, tokens, logits.data(), T, &idx, &wk);
  std::vector<std::vector<int32_t>> rows(static_cast<size_t>(E));
  std::vector<std::vector<float>> wts(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < K; ++j) {
      const int32_t e = idx[size_t(t * K + j)];
      rows[size_t(e)].push_back(int32_t(t));
      wts[size_t(e)].push_back(wk[size_t(t * K + j)]);
    }

  std::fill(out, out + T * D, 0.0f);
  for (int64_t e = 0; e < E; ++e)
    expert_apply(lw.experts[size_t(e)], c.swiglu_limit, x, D, rows[size_t(e)], wts[size_t(e)], out, opt.act_quant);
  if (lw.has_shared) {
    std::vector<int32_t> all(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) all[size_t(t)] = int32_t(t);
    expert_apply(lw.shared, c.swiglu_limit, x, D, all, std::vector<float>(size_t(T), 1.0f), out, opt.act_quant);
  }
}

}  // namespace cm
