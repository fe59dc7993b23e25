// Loading DeepSeek-V4 weights from a TensorStore in either key spelling.
// The release spelling (no prefix) is the canonical one used in code; the
// transformers spelling is derived from it by weight_key(). A checkpoint that
// mixes spellings, lacks a tensor, or stores one with the wrong shape is
// rejected with the tensor's name and the expected shape.
#include "model/weights.h"

#include <cmath>
#include <cstring>
#include <tuple>

#include "common/error.h"
#include "common/numeric.h"

namespace cm {

std::string weight_key(const std::string& n, const std::string& spelling) {
  if (spelling == "release") return n;
  // One explicit table for the names that differ beyond the "model." prefix.
  static const std::pair<const char*, const char*> kTable[] = {
      {"embed.weight", "model.embed_tokens.weight"},
      {"head.weight", "head.weight"},
      {"norm.weight", "model.norm.weight"},
      {"hc_head_fn", "model.hc_head.hc_fn"},
      {"hc_head_base", "model.hc_head.hc_base"},
      {"hc_head_scale", "model.hc_head.hc_scale"},
  };
  for (auto& [rel, hf] : kTable)
    if (n == rel) return hf;
  static const std::string kKvNorm = ".attn.kv_norm.weight";
  if (n.size() > kKvNorm.size() && n.compare(n.size() - kKvNorm.size(), kKvNorm.size(), kKvNorm) == 0)
    return "model." + n.substr(0, n.size() - kKvNorm.size()) + ".attn.norm.weight";
  return "model." + n;
}

namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

struct Loader {
  const TensorStore& store;
  const Config& cfg;
  const LoadOptions& opt;
  std::string spelling;

  std::string key(const std::string& n) const { return weight_key(n, spelling); }

  const TensorView& tensor(const std::string& n, const std::vector<int64_t>& shape) const {
    std::string k = key(n);
    const TensorView* t = store.find(k);
    if (!t) fail("missing tensor '{}' (expected shape {})", k, shape_str(shape));
    // A scalar stored as [] or [1] are the same thing.
    bool ok = t->shape == shape || (shape.size() == 1 && shape[0] == 1 && t->shape.empty());
    if (!ok) fail("tensor '{}' has shape {}, expected {}", k, t->shape_str(), shape_str(shape));
    return *t;
  }

  std::vector<float> floats(const std::string& n, const std::vector<int64_t>& shape) const {
    const TensorView& t = tensor(n, shape);
    std::vector<float> v(size_t(t.numel()));
    for (size_t i = 0; i < v.size(); ++i) {
      switch (t.dtype) {
        case DType::F32: std::memcpy(&v[i], t.data + 4 * i, 4); break;
        case DType::BF16: v[i] = bf16_to_f32(uint16_t(t.data[2 * i] | (t.data[2 * i + 1] << 8))); break;
        case DType::F16: v[i] = f16_to_f32(uint16_t(t.data[2 * i] | (t.data[2 * i + 1] << 8))); break;
        default: fail("tensor '{}' has dtype {}, expected F32, BF16 or F16", t.name, dtype_name(t.dtype));
      }
      if (!std::isfinite(v[i])) fail("tensor '{}' holds a non-finite value at index {}", t.name, i);
    }
    return v;
  }

  LinearWeight linear(const std::string& n, int64_t rows, int64_t cols) const {
    std::string k = key(n + ".weight");
    return load_linear(store, k.substr(0, k.size() - 7), rows, cols, opt.linear);
  }

  HcWeights hc_weights(const std::string& p, int64_t rows) const {
    const int64_t D = cfg.hidden_size, hc = cfg.hc_mult;
    HcWeights w;
    w.fn = floats(p + "_fn", {rows, hc * D});
    w.base = floats(p + "_base", {rows});
    w.scale = floats(p + "_scale", {rows == hc ? 1 : 3});
    return w;
  }

  CompressorWeights compressor(const std::string& p, int64_t m, int64_t c, int64_t dc) const {
    CompressorWeights w;
    w.wkv = linear(p + ".wkv", c * dc, cfg.hidden_size);
    w.wgate = linear(p + ".wgate", c * dc, cfg.hidden_size);
    w.ape = floats(p + ".ape", {m, c * dc});
    w.norm = floats(p + ".norm.weight", {dc});
    return w;
  }

  ExpertWeights expert(const std::string& p) const {
    ExpertWeights e;
    e.w1 = linear(p + ".w1", cfg.moe_inter, cfg.hidden_size);
    e.w2 = linear(p + ".w2", cfg.hidden_size, cfg.moe_inter);
    e.w3 = linear(p + ".w3", cfg.moe_inter, cfg.hidden_size);
    return e;
  }

  std::vector<int32_t> tid2eid(const std::string& n) const {
    const TensorView& t = tensor(n, {cfg.vocab_size, cfg.n_experts_per_tok});
    std::vector<int32_t> v(size_t(t.numel()));
    for (size_t i = 0; i < v.size(); ++i) {
      int64_t x;
      if (t.dtype == DType::I64) std::memcpy(&x, t.data + 8 * i, 8);
      else if (t.dtype == DType::I32) {
        int32_t y;
        std::memcpy(&y, t.data + 4 * i, 4);
        x = y;
      } else fail("tensor '{}' has dtype {}, expected I64 or I32", t.name, dtype_name(t.dtype));
      if (x < 0 || x >= cfg.n_routed_experts)
        fail("tensor '{}': token {} routes to expert {}, outside [0, {})", t.name, int64_t(i) / cfg.n_experts_per_tok,
             x, cfg.n_routed_experts);
      v[i] = int32_t(x);
    }
    return v;
  }

  // The first stored tensor whose name starts with `prefix`, or nullptr.
  const std::string* first_with_prefix(const std::string& prefix) const {
    auto it = store.all().lower_bound(prefix);
    if (it == store.all().end() || it->first.compare(0, prefix.size(), prefix) != 0) return nullptr;
    return &it->first;
  }

  // The config's layer kind against the checkpoint: compressor tensors exactly
  // on compressed (CSA/HCA) layers, indexer tensors exactly on CSA layers.
  // lp: the block's key prefix ("layers.3", "mtp.0"); label: how errors name it ("layer 3").
  void check_layer_kind(const std::string& lp, const std::string& label, AttnKind kind, int64_t ratio) const {
    const std::string p = lp + ".attn.";
    const std::string* comp = first_with_prefix(key(p + "compressor."));
    const std::string* ix = first_with_prefix(key(p + "indexer."));
    const std::string what = fmt::format("{}: compress_ratio {} in the config makes it {}", label, ratio,
                                         kind == AttnKind::SLIDING ? "sliding-window only"
                                         : kind == AttnKind::CSA   ? "CSA (compressor + indexer)"
                                                                   : "HCA (compressor, no indexer)");
    if (kind == AttnKind::SLIDING && comp)
      fail("{}, but the checkpoint has compressor tensors ('{}')", what, *comp);
    if (kind != AttnKind::SLIDING && !comp)
      fail("{}, but the checkpoint has no '{}*' tensors", what, key(p + "compressor."));
    if (kind != AttnKind::CSA && ix)
      fail("{}, but the checkpoint has indexer tensors ('{}'), which only CSA layers (ratio 4) have", what, *ix);
    if (kind == AttnKind::CSA && !ix) fail("{}, but the checkpoint has no '{}*' tensors", what, key(p + "indexer."));
  }

  LayerWeights layer(int64_t L) const {
    return block("layers." + std::to_string(L), "layer " + std::to_string(L), cfg.attn_kinds[size_t(L)], cfg.ratio(L),
                 cfg.moe_kinds[size_t(L)]);
  }

  // A block's weights under key prefix p (a main layer or an MTP block's; errors call it `label`), of the
  // given attention kind, compress ratio and routing.
  LayerWeights block(const std::string& p, const std::string& label, AttnKind kind, int64_t m, MoeKind moe) const {
    const Config& c = cfg;
    const int64_t D = c.hidden_size, hd = c.head_dim, H = c.num_heads, hc = c.hc_mult;
    LayerWeights w;
    w.hc_attn = hc_weights(p + ".hc_attn", (2 + hc) * hc);
    w.hc_ffn = hc_weights(p + ".hc_ffn", (2 + hc) * hc);
    w.attn_norm = floats(p + ".attn_norm.weight", {D});
    w.ffn_norm = floats(p + ".ffn_norm.weight", {D});
    w.wq_a = linear(p + ".attn.wq_a", c.q_lora_rank, D);
    w.q_norm = floats(p + ".attn.q_norm.weight", {c.q_lora_rank});
    w.wq_b = linear(p + ".attn.wq_b", H * hd, c.q_lora_rank);
    w.wkv = linear(p + ".attn.wkv", hd, D);
    w.kv_norm = floats(p + ".attn.kv_norm.weight", {hd});
    w.wo_a = linear(p + ".attn.wo_a", c.o_groups * c.o_lora_rank, H * hd / c.o_groups);
    w.wo_b = linear(p + ".attn.wo_b", D, c.o_groups * c.o_lora_rank);
    w.sinks = floats(p + ".attn.attn_sink", {H});
    check_layer_kind(p, label, kind, m);
    try {
      if (kind != AttnKind::SLIDING) {
        const int64_t cc = kind == AttnKind::CSA ? 2 : 1;
        w.compressor = std::make_unique<CompressorWeights>(compressor(p + ".attn.compressor", m, cc, hd));
      }
      if (kind == AttnKind::CSA) {
        auto ix = std::make_unique<IndexerWeights>();
        ix->wq_b = linear(p + ".attn.indexer.wq_b", c.index_n_heads * c.index_head_dim, c.q_lora_rank);
        ix->weights_proj = linear(p + ".attn.indexer.weights_proj", c.index_n_heads, D);
        ix->comp = compressor(p + ".attn.indexer.compressor", m, 2, c.index_head_dim);
        w.indexer = std::move(ix);
      }
    } catch (const Error& e) {
      fail("{} ({}, compress ratio {} in the config): {}", label, attn_kind_name(kind), m, e.what());
    }
    w.gate = linear(p + ".ffn.gate", c.n_routed_experts, D);
    if (moe == MoeKind::HASH) w.tid2eid = tid2eid(p + ".ffn.gate.tid2eid");
    else w.gate_bias = floats(p + ".ffn.gate.bias", {c.n_routed_experts});
    const auto [e0, e1] = expert_bounds(opt.experts, c.n_routed_experts);
    w.experts.resize(size_t(c.n_routed_experts));
    for (int64_t e = e0; e < e1; ++e) w.experts[size_t(e)] = expert(p + ".ffn.experts." + std::to_string(e));
    w.has_shared = c.n_shared_experts > 0;
    if (w.has_shared) w.shared = expert(p + ".ffn.shared_experts");
    return w;
  }

  // MTP block i (spec §8): sliding window only, score-routed (its layer id is past the hash layers).
  MtpWeights mtp(int64_t i) const {
    const int64_t D = cfg.hidden_size, hc = cfg.hc_mult;
    const std::string p = "mtp." + std::to_string(i);
    const int64_t ratio = size_t(i) < cfg.mtp_ratios.size() ? cfg.mtp_ratios[size_t(i)] : 0;
    if (ratio != 0)
      fail("{}: compress_ratio {} in the config; MTP blocks with a compressor are not supported (V4's are 0)", p,
           ratio);
    MtpWeights w;
    w.e_proj = linear(p + ".e_proj", D, D);
    w.h_proj = linear(p + ".h_proj", D, D);
    w.enorm = floats(p + ".enorm.weight", {D});
    w.hnorm = floats(p + ".hnorm.weight", {D});
    w.norm = floats(p + ".norm.weight", {D});
    w.hc_head_fn = floats(p + ".hc_head_fn", {hc, hc * D});
    w.hc_head_base = floats(p + ".hc_head_base", {hc});
    w.hc_head_scale = floats(p + ".hc_head_scale", {1});
    w.block = block(p, "MTP block " + std::to_string(i), AttnKind::SLIDING, 0, MoeKind::SCORE);
    return w;
  }
};

LinearWeight linear_view(const LinearWeight& w) {
  LinearWeight v;
  v.name = w.name;
  v.format = w.format;
  v.out_features = w.out_features;
  v.in_features = w.in_features;
  v.data = w.data;
  v.scale = w.scale;
  v.scale_dtype = w.scale_dtype;
  v.scale_rows = w.scale_rows;
  v.scale_cols = w.scale_cols;
  v.scale_2 = w.scale_2;
  v.input_scale = w.input_scale;
  return v;
}

}  // namespace

int64_t checkpoint_mtp_blocks(const TensorStore& store) {
  int64_t n = 0;
  for (;; ++n) {
    bool any = false;
    for (const char* pre : {"mtp.", "model.mtp."}) {
      const std::string prefix = pre + std::to_string(n) + ".";
      auto it = store.all().lower_bound(prefix);
      any = any || (it != store.all().end() && it->first.compare(0, prefix.size(), prefix) == 0);
    }
    if (!any) return n;
  }
}

std::pair<int64_t, int64_t> expert_bounds(const ExpertRange& r, int64_t E) {
  if (r.count < 0 && r.first == 0) return {0, E};
  if (r.first < 0 || r.count < 0 || r.first + r.count > E)
    fail("expert range first {} count {} is outside the model's {} routed experts", r.first, r.count, E);
  return {r.first, r.first + r.count};
}

Weights weights_load(const TensorStore& store, const Config& cfg, const LoadOptions& opt) {
  std::string spelling;
  const bool rel = store.find("embed.weight") != nullptr, hf = store.find("model.embed_tokens.weight") != nullptr;
  if (rel && hf) fail("checkpoint mixes key spellings: both 'embed.weight' and 'model.embed_tokens.weight' exist");
  if (!rel && !hf) fail("missing tensor 'embed.weight' (or 'model.embed_tokens.weight' in transformers spelling)");
  spelling = rel ? "release" : "transformers";
  for (auto& [name, t] : store.all()) {
    (void)t;
    bool hf_name = name.rfind("model.", 0) == 0;
    bool rel_name = name.rfind("layers.", 0) == 0 || name.rfind("mtp.", 0) == 0 || name == "norm.weight" ||
                    name.rfind("hc_head_", 0) == 0;
    if ((spelling == "release" && hf_name) || (spelling == "transformers" && rel_name))
      fail("checkpoint mixes key spellings: '{}' does not use the {} spelling of the rest", name, spelling);
  }
  Loader ld{store, cfg, opt, spelling};
  const int64_t D = cfg.hidden_size, hc = cfg.hc_mult;
  Weights w;
  w.spelling = spelling;
  std::tie(w.experts_first, w.experts_end) = expert_bounds(opt.experts, cfg.n_routed_experts);
  w.embed = ld.linear("embed", cfg.vocab_size, D);
  if (cfg.tie_word_embeddings && !store.find(ld.key("head.weight"))) w.head = linear_view(w.embed);
  else w.head = ld.linear("head", cfg.vocab_size, D);
  w.norm = ld.floats("norm.weight", {D});
  w.hc_head_fn = ld.floats("hc_head_fn", {hc, hc * D});
  w.hc_head_base = ld.floats("hc_head_base", {hc});
  w.hc_head_scale = ld.floats("hc_head_scale", {1});
  w.layers.reserve(size_t(cfg.num_layers));
  for (int64_t L = 0; L < cfg.num_layers; ++L) w.layers.push_back(ld.layer(L));
  if (opt.mtp) {
    // DeepSeek's later Flash checkpoints draft with DSpark stages (dspark_* keys) instead of MTP blocks.
    for (const auto& [name, t] : store.all())
      if (name.find("dspark") != std::string::npos)
        fail("MTP asked for, but the checkpoint drafts with DSpark stages ('{}'), which clawmine does not run yet "
             "(run it without --mtp)", name);
    const int64_t have = checkpoint_mtp_blocks(store);
    if (cfg.num_nextn_predict_layers == 0)
      fail("MTP asked for, but the config has num_nextn_predict_layers = 0 (no MTP block)");
    if (have == 0)
      fail("MTP asked for, but the checkpoint has no MTP weights (no '{}' tensors; its config names {} block(s))",
           ld.key("mtp.0.*"), cfg.num_nextn_predict_layers);
    for (int64_t i = 0; i < cfg.num_nextn_predict_layers; ++i) w.mtp.push_back(ld.mtp(i));
  }
  return w;
}

}  // namespace cm
