// config.json parsing for both spellings; see config.h.
#include "model/config.h"

#include <cmath>
#include <filesystem>

#include "common/error.h"
#include "io/input_file.h"

namespace cm {

using json = nlohmann::json;

const char* attn_kind_name(AttnKind k) {
  switch (k) {
    case AttnKind::SLIDING: return "sliding";
    case AttnKind::CSA: return "CSA";
    case AttnKind::HCA: return "HCA";
  }
  return "?";
}

namespace {

struct Reader {
  const json& j;
  const std::string& src;

  bool has(const char* k) const { return j.contains(k) && !j[k].is_null(); }

  int64_t integer(const char* k, int64_t lo, int64_t hi, bool required = true, int64_t def = 0) const {
    if (!has(k)) {
      if (required) fail("{}: missing required key '{}'", src, k);
      return def;
    }
    const json& v = j[k];
    if (!v.is_number_integer()) fail("{}: key '{}': expected an integer, got {}", src, k, describe_json(v));
    int64_t x = 0;
    if (!json_int_in(v, lo, hi, &x)) fail("{}: '{}' = {} is out of range [{}, {}]", src, k, v.dump(), lo, hi);
    return x;
  }
  double number(const char* k, double lo, double hi, bool required = true, double def = 0) const {
    if (!has(k)) {
      if (required) fail("{}: missing required key '{}'", src, k);
      return def;
    }
    const json& v = j[k];
    if (!v.is_number()) fail("{}: key '{}': expected a number, got {}", src, k, describe_json(v));
    double x = v.get<double>();
    if (!std::isfinite(x) || x < lo || x > hi) fail("{}: '{}' = {} is out of range [{}, {}]", src, k, x, lo, hi);
    return x;
  }
  bool boolean(const char* k, bool def) const {
    if (!has(k)) return def;
    if (!j[k].is_boolean()) fail("{}: key '{}': expected a boolean, got {}", src, k, json_type_name(j[k]));
    return j[k].get<bool>();
  }
  std::string string(const char* k, const std::string& def) const {
    if (!has(k)) return def;
    if (!j[k].is_string()) fail("{}: key '{}': expected a string, got {}", src, k, json_type_name(j[k]));
    return j[k].get<std::string>();
  }
};

RopeConfig rope_from(const json& p, double theta, const std::string& src, const char* what, double max_pos) {
  RopeConfig r;
  r.theta = theta;
  if (!p.is_object()) return r;
  std::string type = "default";
  if (p.contains("rope_type") && p["rope_type"].is_string()) type = p["rope_type"].get<std::string>();
  else if (p.contains("type") && p["type"].is_string()) type = p["type"].get<std::string>();
  if (p.contains("rope_theta") && p["rope_theta"].is_number()) r.theta = p["rope_theta"].get<double>();
  if (!(r.theta > 1.0) || !std::isfinite(r.theta)) fail("{}: {} rope_theta = {} must be > 1", src, what, r.theta);
  if (type == "default") return r;
  if (type != "yarn")
    fail("{}: {} rope type '{}' is not supported (default or yarn)", src, what, truncate_text(type, 60));
  r.yarn = true;
  auto num = [&](const char* k, double def) {
    if (!p.contains(k) || p[k].is_null()) return def;
    if (!p[k].is_number()) fail("{}: {} rope '{}' must be a number", src, what, k);
    return p[k].get<double>();
  };
  r.original_max_position = num("original_max_position_embeddings", 0);
  if (!(r.original_max_position >= 1)) fail("{}: {} YaRN needs original_max_position_embeddings >= 1", src, what);
  r.factor = num("factor", max_pos / r.original_max_position);
  r.beta_fast = num("beta_fast", 32);
  r.beta_slow = num("beta_slow", 1);
  if (r.beta_fast == 0) r.beta_fast = 32;  // transformers: `beta_fast or 32`
  if (r.beta_slow == 0) r.beta_slow = 1;
  // transformers' V4 config forces attention_factor = 1.0 unless the file sets it.
  r.attention_factor = num("attention_factor", 1.0);
  if (!(r.factor >= 1.0) || !std::isfinite(r.factor)) fail("{}: {} YaRN factor = {} must be >= 1", src, what, r.factor);
  if (!(r.attention_factor > 0) || !std::isfinite(r.attention_factor))
    fail("{}: {} rope attention_factor must be > 0", src, what);
  return r;
}

}  // namespace

Config config_from_json(const json& j, const std::string& src) {
  if (!j.is_object()) fail("{}: not a JSON object", src);
  Reader r{j, src};
  const std::string model_type = r.string("model_type", "deepseek_v4");
  if (model_type != "deepseek_v4")
    fail("{}: model_type '{}' is not a DeepSeek-V4 model (expected deepseek_v4)", src, truncate_text(model_type, 60));
  Config c;
  const int64_t kBig = int64_t(1) << 40;
  c.vocab_size = r.integer("vocab_size", 1, int64_t(1) << 31);
  c.hidden_size = r.integer("hidden_size", 1, 1 << 20);
  c.num_layers = r.integer("num_hidden_layers", 1, 4096);
  c.num_heads = r.integer("num_attention_heads", 1, 1 << 16);
  int64_t kv_heads = r.integer("num_key_value_heads", 1, 1, false, 1);
  (void)kv_heads;
  c.head_dim = r.integer("head_dim", 2, 1 << 16);
  if (r.has("qk_rope_head_dim")) {
    c.rope_dim = r.integer("qk_rope_head_dim", 2, c.head_dim);
  } else if (r.has("partial_rotary_factor")) {
    double f = r.number("partial_rotary_factor", 0.0, 1.0);
    c.rope_dim = int64_t(double(c.head_dim) * f);
  } else {
    c.rope_dim = 64;
  }
  if (c.rope_dim <= 0 || c.rope_dim % 2 || c.rope_dim > c.head_dim)
    fail("{}: RoPE dims {} must be even and within head_dim {}", src, c.rope_dim, c.head_dim);
  c.q_lora_rank = r.integer("q_lora_rank", 1, 1 << 20);
  c.o_groups = r.integer("o_groups", 1, 1 << 16);
  c.o_lora_rank = r.integer("o_lora_rank", 1, 1 << 20);
  if (c.num_heads % c.o_groups) fail("{}: num_attention_heads {} is not divisible by o_groups {}", src, c.num_heads, c.o_groups);
  c.n_routed_experts = r.integer("n_routed_experts", 1, 1 << 16);
  c.n_experts_per_tok = r.integer("num_experts_per_tok", 1, c.n_routed_experts);
  c.n_shared_experts = r.integer("n_shared_experts", 0, 1, false, 1);
  c.moe_inter = r.integer("moe_intermediate_size", 1, 1 << 20);
  c.routed_scaling_factor = r.number("routed_scaling_factor", 0.0, 1e6, false, 1.0);
  c.norm_topk_prob = r.boolean("norm_topk_prob", true);
  if (!c.norm_topk_prob) fail("{}: norm_topk_prob = false is not supported by DeepSeek-V4 routing", src);
  std::string scoring = r.string("scoring_func", "sqrtsoftplus");
  if (scoring != "sqrtsoftplus")
    fail("{}: scoring_func '{}' is not supported (sqrtsoftplus)", src, truncate_text(scoring, 60));
  c.swiglu_limit = float(r.number("swiglu_limit", 0.0, 1e9, false, 0.0));
  c.sliding_window = r.integer("sliding_window", 1, 1 << 20);
  c.index_n_heads = r.integer("index_n_heads", 1, 1 << 12);
  c.index_head_dim = r.integer("index_head_dim", 1, 1 << 14);
  if (c.index_head_dim < c.rope_dim)
    fail("{}: index_head_dim {} is smaller than the RoPE dims {}", src, c.index_head_dim, c.rope_dim);
  c.index_topk = r.integer("index_topk", 1, kBig);
  c.hc_mult = r.integer("hc_mult", 1, 16);
  c.hc_sinkhorn_iters = r.integer("hc_sinkhorn_iters", 1, 1000);
  c.hc_eps = float(r.number("hc_eps", 0.0, 1.0, false, 1e-6));
  c.rms_norm_eps = float(r.number("rms_norm_eps", 0.0, 1.0, false, 1e-6));
  c.max_position_embeddings = r.integer("max_position_embeddings", 1, kBig);
  c.num_nextn_predict_layers = r.integer("num_nextn_predict_layers", 0, 64, false, 0);
  c.bos_token_id = r.has("bos_token_id") ? r.integer("bos_token_id", 0, c.vocab_size - 1) : -1;
  if (r.has("eos_token_id")) {
    const json& e = j["eos_token_id"];
    auto id = [&](const json& x) {
      if (!x.is_number_integer())
        fail("{}: key 'eos_token_id': expected an integer or a list of integers, got {}", src, describe_json(x));
      int64_t v = 0;
      if (!json_int_in(x, 0, c.vocab_size - 1, &v))
        fail("{}: eos_token_id {} is outside the vocabulary [0, {})", src, x.dump(), c.vocab_size);
      c.eos_token_ids.push_back(v);
    };
    if (e.is_array()) {
      for (const json& x : e) id(x);
    } else {
      id(e);
    }
  }
  c.tie_word_embeddings = r.boolean("tie_word_embeddings", false);
  if (j.contains("quantization_config")) {
    const json& q = j["quantization_config"];
    if (!q.is_null() && !q.is_object())
      fail("{}: key 'quantization_config': expected an object, got {}", src, json_type_name(q));
    c.quantization = q;
  }

  // --- layer kinds
  const bool hf_form = r.has("layer_types");
  if (hf_form && r.has("compress_ratios"))
    fail("{}: both layer_types and compress_ratios are present; a config uses one spelling", src);
  c.spelling = hf_form ? "transformers" : "release";
  if (hf_form) {
    if (r.has("compress_rates")) {
      const json& cr = j["compress_rates"];
      if (!cr.is_object()) fail("{}: compress_rates must be an object", src);
      for (auto it = cr.begin(); it != cr.end(); ++it) {
        const std::string key = truncate_text(it.key(), 60);
        if (!it.value().is_number_integer())
          fail("{}: compress_rates['{}']: expected an integer, got {}", src, key, json_type_name(it.value()));
        int64_t v = it.value().get<int64_t>();
        if (v < 2 || v > 1 << 16) fail("{}: compress_rates['{}'] = {} is out of range [2, 65536]", src, key, v);
        if (it.key() == "compressed_sparse_attention") c.csa_ratio = v;
        else if (it.key() == "heavily_compressed_attention") c.hca_ratio = v;
        else fail("{}: compress_rates has unknown layer type '{}'", src, key);
      }
    }
    const json& lt = j["layer_types"];
    if (!lt.is_array() || int64_t(lt.size()) != c.num_layers)
      fail("{}: layer_types must list {} layers (num_hidden_layers), got {}", src, c.num_layers,
           lt.is_array() ? std::to_string(lt.size()) : json_type_name(lt));
    for (const json& t : lt) {
      std::string s = t.is_string() ? truncate_text(t.get<std::string>(), 60) : describe_json(t);
      if (s == "sliding_attention") c.attn_kinds.push_back(AttnKind::SLIDING);
      else if (s == "compressed_sparse_attention") c.attn_kinds.push_back(AttnKind::CSA);
      else if (s == "heavily_compressed_attention") c.attn_kinds.push_back(AttnKind::HCA);
      else fail("{}: unknown layer type '{}' in layer_types", src, s);
    }
  } else {
    if (!r.has("compress_ratios")) fail("{}: missing layer kinds: neither layer_types nor compress_ratios", src);
    const json& cr = j["compress_ratios"];
    if (!cr.is_array()) fail("{}: compress_ratios must be a list", src);
    int64_t n = int64_t(cr.size());
    if (n != c.num_layers && n != c.num_layers + c.num_nextn_predict_layers)
      fail("{}: compress_ratios has {} entries; expected {} layers + {} MTP = {}", src, n, c.num_layers,
           c.num_nextn_predict_layers, c.num_layers + c.num_nextn_predict_layers);
    // The official code's rule: 0 = sliding window only, 4 = CSA (overlapping
    // compressor + indexer), any other positive ratio = HCA. Entries past the
    // main layers belong to the MTP blocks and are only checked.
    bool hca_seen = false;
    for (int64_t i = 0; i < n; ++i) {
      const json& x = cr[size_t(i)];
      if (!x.is_number_integer())
        fail("{}: compress_ratios[{}]: expected an integer, got {}", src, i, describe_json(x));
      int64_t v = 0;
      if (!json_int_in(x, 0, 1 << 16, &v))
        fail("{}: compress_ratios[{}] = {} is out of range [0, 65536]", src, i, x.dump());
      if (i >= c.num_layers) {
        c.mtp_ratios.push_back(v);
        continue;
      }
      c.attn_kinds.push_back(v == 0 ? AttnKind::SLIDING : v == 4 ? AttnKind::CSA : AttnKind::HCA);
      c.layer_ratios.push_back(v);
      if (c.attn_kinds.back() == AttnKind::HCA && !hca_seen) c.hca_ratio = v, hca_seen = true;
    }
  }
  if (c.layer_ratios.empty())
    for (AttnKind k : c.attn_kinds)
      c.layer_ratios.push_back(k == AttnKind::CSA ? c.csa_ratio : k == AttnKind::HCA ? c.hca_ratio : 0);
  if (r.has("mlp_layer_types")) {
    const json& mt = j["mlp_layer_types"];
    if (!mt.is_array() || int64_t(mt.size()) != c.num_layers)
      fail("{}: mlp_layer_types must list {} layers", src, c.num_layers);
    for (const json& t : mt) {
      std::string s = t.is_string() ? truncate_text(t.get<std::string>(), 60) : describe_json(t);
      if (s == "hash_moe") c.moe_kinds.push_back(MoeKind::HASH);
      else if (s == "moe") c.moe_kinds.push_back(MoeKind::SCORE);
      else fail("{}: unknown MLP layer type '{}' in mlp_layer_types", src, s);
    }
  } else {
    int64_t nh = r.has("num_hash_layers") ? r.integer("num_hash_layers", 0, c.num_layers)
                                          : r.integer("n_hash_layers", 0, c.num_layers, false, 3);
    for (int64_t i = 0; i < c.num_layers; ++i) c.moe_kinds.push_back(i < nh ? MoeKind::HASH : MoeKind::SCORE);
  }

  // --- RoPE
  double rope_theta = r.number("rope_theta", 1.0, 1e12, false, 10000.0);
  double compress_theta = r.number("compress_rope_theta", 1.0, 1e12, false, 160000.0);
  const double max_pos = double(c.max_position_embeddings);
  json rp = r.has("rope_parameters") ? j["rope_parameters"] : json();
  if (rp.is_object() && rp.contains("main") && rp.contains("compress")) {
    c.rope_main = rope_from(rp["main"], rope_theta, src, "main", max_pos);
    c.rope_compress = rope_from(rp["compress"], compress_theta, src, "compress", max_pos);
  } else {
    // Flat form: YaRN keys (rope_parameters or the release rope_scaling) apply to the
    // compressed layers only; the main rope is plain (spec §1.2).
    json flat = rp.is_object() ? rp : (r.has("rope_scaling") ? j["rope_scaling"] : json());
    json comp = flat.is_object() ? flat : json::object();
    comp.erase("rope_theta");
    c.rope_main = rope_from(json::object(), rope_theta, src, "main", max_pos);
    c.rope_compress = rope_from(comp, compress_theta, src, "compress", max_pos);
  }
  return c;
}

Config config_parse(std::string_view text, const std::string& source) {
  return config_from_json(parse_json(text, source), source);
}

Config config_load(const std::string& dir) {
  std::filesystem::path p = std::filesystem::path(dir) / "config.json";
  return config_parse(read_regular_file(p.string(), kMaxConfigBytes), p.string());
}

std::vector<float> rope_frequencies(const RopeConfig& r, int64_t rope_dim) {
  const int64_t half = rope_dim / 2;
  std::vector<float> f(static_cast<size_t>(half));
  // transformers computes base^(2i/dim) in fp32 and then 1/x; do the same so
  // the angles agree bit-for-bit at large positions.
  for (int64_t i = 0; i < half; ++i) {
    float pos_freq = std::pow(float(r.theta), float(2 * i) / float(rope_dim));
    f[size_t(i)] = 1.0f / pos_freq;
  }
  if (!r.yarn) return f;
  auto corr = [&](double nrot) {
    return double(rope_dim) * std::log(r.original_max_position / (nrot * 2 * M_PI)) / (2 * std::log(r.theta));
  };
  double lo = std::max(std::floor(corr(r.beta_fast)), 0.0);
  double hi = std::min(std::ceil(corr(r.beta_slow)), double(rope_dim - 1));
  if (lo == hi) hi += 0.001;
  for (int64_t i = 0; i < half; ++i) {
    float ramp = float((double(i) - lo) / (hi - lo));
    ramp = std::min(1.0f, std::max(0.0f, ramp));
    float extra = f[size_t(i)];
    float inter = 1.0f / (float(r.factor) * std::pow(float(r.theta), float(2 * i) / float(rope_dim)));
    float extra_factor = 1.0f - ramp;
    f[size_t(i)] = inter * (1.0f - extra_factor) + extra * extra_factor;
  }
  return f;
}

}  // namespace cm
