// The synthetic model (see synthetic.h). Every value is a hash of (seed,
// tensor, index), so a tensor is the same bits whatever the thread count and
// large tensors fill in parallel.
#include "model/synthetic.h"

#include <cmath>
#include <string>

#include "common/error.h"
#include "common/numeric.h"

namespace cm {

namespace {

uint64_t mix(uint64_t x) {  // splitmix64's finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Uniform in [-1, 1).
float unit(uint64_t h) { return float(int64_t(h >> 40) - (int64_t(1) << 23)) / float(1 << 23); }

uint64_t name_seed(uint64_t seed, const std::string& name) {
  uint64_t h = mix(seed);
  for (char ch : name) h = mix(h ^ uint64_t(uint8_t(ch)));
  return h;
}

void fill_bytes(std::vector<uint8_t>& v, uint64_t s) {
  const int64_t words = int64_t(v.size() / 8);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < words; ++i) {
    const uint64_t h = mix(s ^ uint64_t(i) * 0xd1342543de82ef95ull);
    for (int b = 0; b < 8; ++b) v[size_t(i * 8 + b)] = uint8_t(h >> (8 * b));
  }
  for (size_t i = size_t(words) * 8; i < v.size(); ++i) v[i] = uint8_t(mix(s + i));
}

LinearWeight shell(std::string name, WeightFormat f, int64_t N, int64_t K) {
  LinearWeight w;
  w.name = std::move(name);
  w.format = f;
  w.out_features = N;
  w.in_features = K;
  return w;
}

std::vector<float> const_vec(int64_t n, float v) { return std::vector<float>(size_t(n), v); }

std::vector<float> rand_vec(int64_t n, float amp, uint64_t s) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = amp * unit(mix(s ^ uint64_t(i) * 0x9e3779b97f4a7c15ull));
  return v;
}

HcWeights hc_weights(const Config& c, int64_t rows, uint64_t s) {
  HcWeights h;
  h.fn = rand_vec(rows * c.hc_mult * c.hidden_size, std::sqrt(3.0f / float(c.hc_mult * c.hidden_size)), s);
  h.base = const_vec(rows, 0.0f);
  h.scale = const_vec(rows == c.hc_mult ? 1 : 3, 1.0f);
  return h;
}

CompressorWeights compressor(const Config& c, const std::string& p, int64_t m, int64_t cc, int64_t dc, uint64_t seed) {
  CompressorWeights w;
  w.wkv = synthetic_bf16(p + ".wkv", cc * dc, c.hidden_size, seed);
  w.wgate = synthetic_bf16(p + ".wgate", cc * dc, c.hidden_size, seed);
  w.ape = rand_vec(m * cc * dc, 0.1f, name_seed(seed, p + ".ape"));
  w.norm = const_vec(dc, 1.0f);
  return w;
}

ExpertWeights expert(const Config& c, const std::string& p, bool nvfp4, uint64_t seed) {
  auto make = nvfp4 ? synthetic_nvfp4 : synthetic_fp8;
  ExpertWeights e;
  e.w1 = make(p + ".w1", c.moe_inter, c.hidden_size, seed);
  e.w2 = make(p + ".w2", c.hidden_size, c.moe_inter, seed);
  e.w3 = make(p + ".w3", c.moe_inter, c.hidden_size, seed);
  return e;
}

}  // namespace

LinearWeight synthetic_nvfp4(std::string name, int64_t N, int64_t K, uint64_t seed) {
  CM_CHECK(K % 16 == 0, "synthetic NVFP4 '{}': K = {} is not a multiple of 16", name, K);
  const uint64_t s = name_seed(seed, name);
  LinearWeight w = shell(std::move(name), WeightFormat::NVFP4, N, K);
  w.owned.resize(size_t(N * K / 2));
  fill_bytes(w.owned, s);  // any E2M1 nibble is a valid code
  w.owned_scale.resize(size_t(N * K / 16));
  fill_bytes(w.owned_scale, s ^ 1);
  for (uint8_t& b : w.owned_scale) b = uint8_t(0x38 | (b & 7));  // E4M3 1.0 .. 1.875: finite, nonzero
  w.data = w.owned.data();
  w.scale = w.owned_scale.data();
  w.scale_dtype = DType::F8_E4M3;
  w.scale_rows = N;
  w.scale_cols = K / 16;
  // E2M1 codes have rms 2.93 and the block scales average 1.44.
  w.scale_2 = 1.0f / (2.93f * 1.44f * std::sqrt(float(K)));
  w.input_scale = 1.0f / (6.0f * 448.0f);
  return w;
}

LinearWeight synthetic_fp8(std::string name, int64_t N, int64_t K, uint64_t seed) {
  const uint64_t s = name_seed(seed, name);
  LinearWeight w = shell(std::move(name), WeightFormat::FP8_BLOCK, N, K);
  w.owned.resize(size_t(N * K));
  fill_bytes(w.owned, s);
  // Sign, exponent field 6..8 (0.5 .. 3.75), any mantissa: rms about 1.5, never NaN.
  for (uint8_t& b : w.owned) b = uint8_t((b & 0x80) | ((6 + (b >> 3 & 0xf) % 3) << 3) | (b & 7));
  w.scale_rows = (N + 127) / 128;
  w.scale_cols = (K + 127) / 128;
  const int e = int(std::lround(std::log2(1.0 / (1.5 * std::sqrt(double(K))))));
  w.owned_scale.assign(size_t(w.scale_rows * w.scale_cols), uint8_t(127 + e));
  w.data = w.owned.data();
  w.scale = w.owned_scale.data();
  w.scale_dtype = DType::F8_E8M0;
  return w;
}

LinearWeight synthetic_bf16(std::string name, int64_t N, int64_t K, uint64_t seed) {
  const uint64_t s = name_seed(seed, name);
  LinearWeight w = shell(std::move(name), WeightFormat::BF16, N, K);
  w.owned.resize(size_t(N * K) * 2);
  const float amp = std::sqrt(3.0f / float(K));  // uniform [-amp, amp): rms 1/sqrt(K)
  const int64_t n = N * K;
  uint8_t* p = w.owned.data();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t h = f32_to_bf16(amp * unit(mix(s ^ uint64_t(i) * 0xd1342543de82ef95ull)));
    p[2 * i] = uint8_t(h);
    p[2 * i + 1] = uint8_t(h >> 8);
  }
  w.data = w.owned.data();
  return w;
}

SyntheticShape synthetic_tiny_shape() {
  SyntheticShape s;
  s.layers = 2;
  s.vocab = 512;
  s.hidden = 256;
  s.heads = 4;
  s.head_dim = 128;
  s.rope_dim = 64;
  s.q_lora = 128;
  s.o_groups = 2;
  s.o_lora = 128;
  s.experts = 8;
  s.topk = 2;
  s.moe_inter = 128;
  s.index_heads = 4;
  s.index_head_dim = 64;
  s.index_topk = 8;
  s.window = 16;
  s.hash_layers = 1;
  s.max_position = 4096;
  s.ratios = {4, 8};
  return s;
}

std::vector<int64_t> flash_compress_ratios(int64_t layers) {
  std::vector<int64_t> r{0, 0};
  for (int i = 0; i < 20; ++i) r.push_back(4), r.push_back(128);
  r.push_back(4);
  CM_CHECK(layers >= 1 && layers <= int64_t(r.size()), "synthetic model: {} layers; V4-Flash has 1 to {}", layers,
           r.size());
  r.resize(size_t(layers));
  return r;
}

nlohmann::json synthetic_config_json(const SyntheticShape& s) {
  std::vector<int64_t> ratios = s.ratios.empty() ? flash_compress_ratios(s.layers) : s.ratios;
  CM_CHECK(int64_t(ratios.size()) == s.layers, "synthetic model: {} compress ratios for {} layers", ratios.size(),
           s.layers);
  ratios.push_back(0);  // the MTP block's entry, as the release config has it
  nlohmann::json j = {
      {"model_type", "deepseek_v4"},
      {"vocab_size", s.vocab},
      {"hidden_size", s.hidden},
      {"num_hidden_layers", s.layers},
      {"num_attention_heads", s.heads},
      {"num_key_value_heads", 1},
      {"head_dim", s.head_dim},
      {"qk_rope_head_dim", s.rope_dim},
      {"q_lora_rank", s.q_lora},
      {"o_groups", s.o_groups},
      {"o_lora_rank", s.o_lora},
      {"n_routed_experts", s.experts},
      {"num_experts_per_tok", s.topk},
      {"n_shared_experts", 1},
      {"moe_intermediate_size", s.moe_inter},
      {"scoring_func", "sqrtsoftplus"},
      {"routed_scaling_factor", 1.5},
      {"norm_topk_prob", true},
      {"num_hash_layers", std::min(s.hash_layers, s.layers)},
      {"swiglu_limit", 10.0},
      {"sliding_window", s.window},
      {"compress_ratios", ratios},
      {"index_n_heads", s.index_heads},
      {"index_head_dim", s.index_head_dim},
      {"index_topk", s.index_topk},
      {"hc_mult", 4},
      {"hc_sinkhorn_iters", 20},
      {"hc_eps", 1e-6},
      {"rms_norm_eps", 1e-6},
      {"rope_theta", 10000.0},
      {"compress_rope_theta", 160000.0},
      {"rope_scaling",
       {{"type", "yarn"},
        {"factor", 16.0},
        {"original_max_position_embeddings", std::min<int64_t>(65536, s.max_position)},
        {"beta_fast", 32},
        {"beta_slow", 1}}},
      {"max_position_embeddings", s.max_position},
      {"num_nextn_predict_layers", 1},
      {"bos_token_id", 0},
      {"eos_token_id", 1},
      {"tie_word_embeddings", false},
  };
  return j;
}

Config synthetic_config(const SyntheticShape& s) { return config_from_json(synthetic_config_json(s), "synthetic"); }

LayerWeights synthetic_layer(const Config& c, int64_t L, uint64_t seed, bool routed_experts) {
  const int64_t D = c.hidden_size, hd = c.head_dim, H = c.num_heads;
  const std::string p = "layers." + std::to_string(L);
  const uint64_t s = name_seed(seed, p);
  LayerWeights w;
  w.hc_attn = hc_weights(c, (2 + c.hc_mult) * c.hc_mult, s ^ 1);
  w.hc_ffn = hc_weights(c, (2 + c.hc_mult) * c.hc_mult, s ^ 2);
  w.attn_norm = const_vec(D, 1.0f);
  w.ffn_norm = const_vec(D, 1.0f);
  w.wq_a = synthetic_fp8(p + ".attn.wq_a", c.q_lora_rank, D, seed);
  w.q_norm = const_vec(c.q_lora_rank, 1.0f);
  w.wq_b = synthetic_fp8(p + ".attn.wq_b", H * hd, c.q_lora_rank, seed);
  w.wkv = synthetic_fp8(p + ".attn.wkv", hd, D, seed);
  w.kv_norm = const_vec(hd, 1.0f);
  w.wo_a = synthetic_fp8(p + ".attn.wo_a", c.o_groups * c.o_lora_rank, H * hd / c.o_groups, seed);
  w.wo_b = synthetic_fp8(p + ".attn.wo_b", D, c.o_groups * c.o_lora_rank, seed);
  w.sinks = const_vec(H, 0.0f);
  const AttnKind kind = c.attn_kinds[size_t(L)];
  const int64_t m = c.ratio(L);
  if (kind != AttnKind::SLIDING)
    w.compressor = std::make_unique<CompressorWeights>(
        compressor(c, p + ".attn.compressor", m, kind == AttnKind::CSA ? 2 : 1, hd, seed));
  if (kind == AttnKind::CSA) {
    auto ix = std::make_unique<IndexerWeights>();
    ix->wq_b = synthetic_fp8(p + ".attn.indexer.wq_b", c.index_n_heads * c.index_head_dim, c.q_lora_rank, seed);
    ix->weights_proj = synthetic_bf16(p + ".attn.indexer.weights_proj", c.index_n_heads, D, seed);
    ix->comp = compressor(c, p + ".attn.indexer.compressor", m, 2, c.index_head_dim, seed);
    w.indexer = std::move(ix);
  }
  w.gate = synthetic_bf16(p + ".ffn.gate", c.n_routed_experts, D, seed);
  const int64_t E = c.n_routed_experts, K = c.n_experts_per_tok;
  if (c.moe_kinds[size_t(L)] == MoeKind::HASH) {
    // K distinct experts per token: a hashed start and a stride of E/K.
    w.tid2eid.resize(size_t(c.vocab_size * K));
    for (int64_t t = 0; t < c.vocab_size; ++t) {
      const int64_t e0 = int64_t(mix(s ^ uint64_t(t)) % uint64_t(E));
      for (int64_t k = 0; k < K; ++k) w.tid2eid[size_t(t * K + k)] = int32_t((e0 + k * (E / K)) % E);
    }
  } else {
    w.gate_bias = const_vec(E, 0.0f);
  }
  w.experts.resize(size_t(E));
  if (routed_experts)
    for (int64_t e = 0; e < E; ++e) w.experts[size_t(e)] = expert(c, p + ".ffn.experts." + std::to_string(e), true, seed);
  w.has_shared = c.n_shared_experts > 0;
  if (w.has_shared) w.shared = expert(c, p + ".ffn.shared_experts", false, seed);
  return w;
}

Weights synthetic_globals(const Config& c, uint64_t seed) {
  const int64_t D = c.hidden_size, hc = c.hc_mult;
  Weights w;
  w.spelling = "release";
  w.experts_first = 0;
  w.experts_end = c.n_routed_experts;
  w.embed = synthetic_bf16("embed", c.vocab_size, D, seed);
  w.head = synthetic_bf16("head", c.vocab_size, D, seed);
  w.norm = const_vec(D, 1.0f);
  w.hc_head_fn = rand_vec(hc * hc * D, std::sqrt(3.0f / float(hc * D)), name_seed(seed, "hc_head_fn"));
  w.hc_head_base = const_vec(hc, 0.0f);
  w.hc_head_scale = const_vec(1, 1.0f);
  return w;
}

std::unique_ptr<Model> synthetic_model_shell(const Config& c) {
  auto m = std::make_unique<Model>();
  m->config = c;
  m->rope_main = RopeTable{rope_frequencies(c.rope_main, c.rope_dim), float(c.rope_main.attention_factor), c.rope_dim};
  m->rope_compress =
      RopeTable{rope_frequencies(c.rope_compress, c.rope_dim), float(c.rope_compress.attention_factor), c.rope_dim};
  return m;
}

std::unique_ptr<Model> synthetic_model(const SyntheticShape& s, uint64_t seed) {
  auto m = synthetic_model_shell(synthetic_config(s));
  m->weights = synthetic_globals(m->config, seed);
  for (int64_t L = 0; L < m->config.num_layers; ++L)
    m->weights.layers.push_back(synthetic_layer(m->config, L, seed, true));
  return m;
}

}  // namespace cm
