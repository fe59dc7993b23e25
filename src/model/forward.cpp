// DeepSeek-V4 forward pass on the CPU, fp32 throughout (spec §3, §15.1).
//
//   X[t, k, :] = embed[token_t]                          k < hc (hyper-connection streams)
//   per layer:  a = HCPre_attn(X);  X = HCPost(Attention(RMSNorm(a)), X)
//               f = HCPre_ffn(X);   X = HCPost(MoE(RMSNorm(f), tokens), X)
//   y = RMSNorm(HCHead(X));  logits = y · headᵀ
//
// A call consumes a chunk of tokens at positions state.pos… and leaves in the
// State everything later tokens need, so a one-shot prefill, prefill in chunks
// and token-by-token decode compute the same logits.
#include <cstring>

#include "common/error.h"
#include "model/model.h"
#include "ops/hc.h"
#include "ops/norm.h"
#include "quant/validate.h"

namespace cm {

std::unique_ptr<Model> model_load(const std::string& dir, const LoadOptions& opt) {
  auto m = std::make_unique<Model>();
  m->config = config_load(dir);
  m->store = TensorStore::open_dir(dir);
  // Every problem of the checkpoint at once (scales, shapes, config), before any weight is used.
  std::vector<std::string> problems = validate_checkpoint(m->store, opt.linear);
  for (std::string& p : check_quant_config(m->config.quantization, m->store)) problems.push_back(std::move(p));
  if (!problems.empty()) {
    std::string msg = dir + ": checkpoint failed validation (" + std::to_string(problems.size()) + " problems):";
    for (const std::string& p : problems) msg += "\n  " + p;
    throw Error(msg);
  }
  m->weights = weights_load(m->store, m->config, opt);
  const Config& c = m->config;
  m->rope_main = RopeTable{rope_frequencies(c.rope_main, c.rope_dim), float(c.rope_main.attention_factor), c.rope_dim};
  m->rope_compress =
      RopeTable{rope_frequencies(c.rope_compress, c.rope_dim), float(c.rope_compress.attention_factor), c.rope_dim};
  return m;
}

namespace {

void observe(const ForwardOptions& opt, const std::string& name, const float* data, std::vector<int64_t> shape) {
  if (opt.observer) opt.observer->observe(name, data, shape);
}

HcParams hc_params(const Config& c, const HcWeights& w) {
  return HcParams{w.fn.data(), w.base.data(), w.scale.data(), c.hc_mult, c.hidden_size, c.hc_sinkhorn_iters,
                  c.hc_eps, c.rms_norm_eps};
}

}  // namespace

std::vector<float> forward(const Model& m, State& st, const int32_t* tokens, int64_t T, const ForwardOptions& opt) {
  const Config& c = m.config;
  const Weights& w = m.weights;
  const int64_t D = c.hidden_size, hc = c.hc_mult, V = c.vocab_size;
  CM_CHECK(T > 0, "forward: no tokens to process");
  CM_CHECK(int64_t(st.layers.size()) == c.num_layers, "forward: state was made for another model");
  if (st.pos + T > c.max_position_embeddings)
    fail("sequence of {} tokens exceeds the model's context of {} (max_position_embeddings)", st.pos + T,
         c.max_position_embeddings);
  for (int64_t t = 0; t < T; ++t)
    if (tokens[t] < 0 || tokens[t] >= V) fail("token id {} is outside the vocabulary [0, {})", tokens[t], V);

  // Embedding, copied into every hyper-connection stream.
  std::vector<float> X(size_t(T * hc * D));
  for (int64_t t = 0; t < T; ++t) {
    linear_expand_row(w.embed, tokens[t], &X[size_t(t * hc * D)]);
    for (int64_t k = 1; k < hc; ++k)
      std::memcpy(&X[size_t((t * hc + k) * D)], &X[size_t(t * hc * D)], size_t(D) * 4);
  }
  observe(opt, "embed", X.data(), {T, hc, D});

  std::vector<float> a(size_t(T * D)), normed(size_t(T * D)), out(size_t(T * D));
  std::vector<float> post(size_t(T * hc)), comb(size_t(T * hc * hc));
  for (int64_t L = 0; L < c.num_layers; ++L) {
    const LayerWeights& lw = w.layers[size_t(L)];
    const std::string p = "l" + std::to_string(L);

    hc_pre_cpu(hc_params(c, lw.hc_attn), X.data(), T, a.data(), post.data(), comb.data());
    rms_norm_cpu(a.data(), lw.attn_norm.data(), T, D, c.rms_norm_eps, normed.data());
    observe(opt, p + ".attn_in", normed.data(), {T, D});
    attention_block(m, L, st.layers[size_t(L)], st.pos, normed.data(), T, out.data(), opt);
    observe(opt, p + ".attn_out", out.data(), {T, D});
    hc_post_cpu(hc, D, out.data(), post.data(), comb.data(), T, X.data());

    hc_pre_cpu(hc_params(c, lw.hc_ffn), X.data(), T, a.data(), post.data(), comb.data());
    rms_norm_cpu(a.data(), lw.ffn_norm.data(), T, D, c.rms_norm_eps, normed.data());
    observe(opt, p + ".moe_in", normed.data(), {T, D});
    moe_block(m, L, tokens, normed.data(), T, out.data(), opt);
    observe(opt, p + ".moe_out", out.data(), {T, D});
    hc_post_cpu(hc, D, out.data(), post.data(), comb.data(), T, X.data());
    observe(opt, p + ".resid", X.data(), {T, hc, D});
  }
  st.pos += T;

  // Final hyper-head, norm and LM head (only the rows whose logits are wanted).
  const int64_t first = opt.all_logits ? 0 : T - 1, rows = T - first;
  HcHeadParams hp{w.hc_head_fn.data(), w.hc_head_base.data(), w.hc_head_scale.data(), hc, D, c.hc_eps,
                  c.rms_norm_eps};
  std::vector<float> y(size_t(rows * D));
  hc_head_cpu(hp, X.data() + first * hc * D, rows, y.data());
  rms_norm_cpu(y.data(), w.norm.data(), rows, D, c.rms_norm_eps, y.data());
  observe(opt, "final_norm", y.data(), {rows, D});
  std::vector<float> logits(size_t(rows * V));
  linear_cpu(w.head, y.data(), rows, logits.data());
  observe(opt, "logits", logits.data(), {rows, V});
  return logits;
}

}  // namespace cm
