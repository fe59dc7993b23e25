// DeepSeek-V4 model configuration, read from config.json in either spelling
// (spec §15.6): the release form (compress_ratios with its trailing MTP entry,
// num_hash_layers, rope_scaling, compress_rope_theta) or the transformers form
// (layer_types, mlp_layer_types, compress_rates, rope_parameters). Layer kinds
// come only from the file, never from defaults. Everything is range-checked;
// a wrong-typed value is named with its key and both types. In the release
// form a compress ratio of 0 is a sliding-window-only layer, 4 is CSA and any
// other positive ratio is HCA (the official code's rule).
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace cm {

enum class AttnKind : uint8_t { SLIDING, CSA, HCA };
enum class MoeKind : uint8_t { HASH, SCORE };
const char* attn_kind_name(AttnKind k);

struct RopeConfig {
  double theta = 10000.0;
  bool yarn = false;
  double factor = 1.0;                  // YaRN scale s
  double original_max_position = 0.0;   // YaRN L0
  double beta_fast = 32.0, beta_slow = 1.0;
  double attention_factor = 1.0;        // multiplies cos/sin (transformers forces 1.0 for V4)
};

struct Config {
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;       // D
  int64_t num_layers = 0;
  int64_t num_heads = 0;         // H
  int64_t head_dim = 0;          // 512
  int64_t rope_dim = 0;          // 64 (trailing dims of each head and indexer head)
  int64_t q_lora_rank = 0;
  int64_t o_groups = 0;
  int64_t o_lora_rank = 0;
  int64_t n_routed_experts = 0;
  int64_t n_experts_per_tok = 0;
  int64_t n_shared_experts = 0;
  int64_t moe_inter = 0;         // moe_intermediate_size (routed and shared)
  double routed_scaling_factor = 1.0;
  bool norm_topk_prob = true;
  float swiglu_limit = 0.0f;     // 0 = no clamp
  int64_t sliding_window = 0;
  // Compress ratios by kind. A release config may give HCA layers different
  // ratios: hca_ratio is then the first HCA layer's, and only layer_ratios /
  // ratio(L) are right for every layer.
  int64_t csa_ratio = 4, hca_ratio = 128;
  std::vector<AttnKind> attn_kinds;  // per layer
  std::vector<int64_t> layer_ratios; // per layer: 0 (sliding) or the compress ratio; filled by config_from_json
  std::vector<MoeKind> moe_kinds;    // per layer
  int64_t index_n_heads = 0, index_head_dim = 0, index_topk = 0;
  int64_t hc_mult = 0, hc_sinkhorn_iters = 0;
  float hc_eps = 1e-6f;
  float rms_norm_eps = 1e-6f;
  RopeConfig rope_main, rope_compress;
  int64_t max_position_embeddings = 0;
  int64_t num_nextn_predict_layers = 0;
  std::vector<int64_t> mtp_ratios;  // compress ratio of each MTP block (compress_ratios' trailing entries; 0 if absent)
  int64_t bos_token_id = -1;
  std::vector<int64_t> eos_token_ids;
  bool tie_word_embeddings = false;
  std::string spelling;            // "release" or "transformers" (config form)
  nlohmann::json quantization;     // quantization_config, or null

  // The compress ratio of a layer (0 for sliding-window-only layers). Configs
  // built by hand without layer_ratios fall back to the per-kind ratios.
  int64_t ratio(int64_t layer) const {
    if (!layer_ratios.empty()) return layer_ratios[size_t(layer)];
    AttnKind k = attn_kinds[size_t(layer)];
    return k == AttnKind::CSA ? csa_ratio : k == AttnKind::HCA ? hca_ratio : 0;
  }
  const RopeConfig& rope_for(int64_t layer) const {
    return attn_kinds[size_t(layer)] == AttnKind::SLIDING ? rope_main : rope_compress;
  }
};

Config config_from_json(const nlohmann::json& j, const std::string& source = "config.json");
// config.json text -> Config (depth-limited JSON parse, then config_from_json);
// config_load reads the file (type-checked, bounded) and calls this.
Config config_parse(std::string_view text, const std::string& source = "config.json");
Config config_load(const std::string& model_dir);  // reads DIR/config.json

// Per-pair RoPE frequencies f_i, i < rope_dim/2 (spec §2, YaRN when enabled).
std::vector<float> rope_frequencies(const RopeConfig& r, int64_t rope_dim);

}  // namespace cm
