// A synthetic DeepSeek-V4 model built in memory, never written to disk: the
// V4-Flash configuration (or any smaller shape) with random weights in the
// formats of the NVFP4 release checkpoint, for benchmarks (`clawmine bench
// model`) and tests. Only speed matters for the values, but every weight is
// valid: E2M1/E4M3 codes are never NaN, block scales are finite and nonzero,
// and magnitudes keep a step's activations finite (weights of rms about
// 1/sqrt(K), so a linear keeps its input's scale).
//
// Formats, as the NVFP4 release stores them: routed experts NVFP4 (E2M1
// nibbles, E4M3 scales per 16, an f32 tensor scale); attention projections,
// the shared expert and the indexer's wq_b FP8 128x128 blocks with E8M0
// scales; router, compressors, the indexer's weights_proj, embedding and head
// BF16; norms, mHC, sinks, biases and ape f32 (expanded as the loader does).
//
// Large models are built a layer at a time (synthetic_layer), so a caller
// can upload and free each before making the next.
#pragma once
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "model/config.h"
#include "model/model.h"
#include "model/weights.h"

namespace cm {

// The sizes of a synthetic model; the defaults are V4-Flash's (its released config).
struct SyntheticShape {
  int64_t layers = 43;
  int64_t vocab = 129280, hidden = 4096, heads = 64, head_dim = 512, rope_dim = 64;
  int64_t q_lora = 1024, o_groups = 8, o_lora = 1024;
  int64_t experts = 256, topk = 6, moe_inter = 2048;
  int64_t index_heads = 64, index_head_dim = 128, index_topk = 512;
  int64_t window = 128, hash_layers = 3;
  int64_t max_position = 1048576;
  // Compress ratio per layer (0 sliding-window only, 4 CSA, else HCA); empty =
  // the first `layers` entries of Flash's pattern [0, 0] + [4, 128] x 20 + [4].
  std::vector<int64_t> ratios;
};

// A small shape for tests: 2 layers (CSA then HCA, ratio 8 so HCA emits entries
// in short sequences), hidden 256, 4 heads of 128, 8 experts top-2.
SyntheticShape synthetic_tiny_shape();

// Flash's compress-ratio pattern for the first `layers` layers.
std::vector<int64_t> flash_compress_ratios(int64_t layers);

// The release-spelled config.json of the shape (Flash's scalars: YaRN on the
// compressed layers, swiglu limit 10, route scale 1.5, hc 4 / 20 iterations).
nlohmann::json synthetic_config_json(const SyntheticShape& s);
// That JSON through config_from_json (every range check of a real config).
Config synthetic_config(const SyntheticShape& s);

// Layer L's weights. Without routed experts, `experts` stays empty (the GPU
// bench makes them on the device). The same (config, L, seed) gives the same bits.
LayerWeights synthetic_layer(const Config& c, int64_t L, uint64_t seed, bool routed_experts);
// Embedding, head, final norm and hyper-head; no layers.
Weights synthetic_globals(const Config& c, uint64_t seed);
// A Model of the config with RoPE tables and no weights (the caller adds them).
std::unique_ptr<Model> synthetic_model_shell(const Config& c);
// The whole model on the host (small shapes; Flash's would need ~160 GB).
std::unique_ptr<Model> synthetic_model(const SyntheticShape& s, uint64_t seed);

// Random weights of one format, [N, K], rms about 1/sqrt(K).
LinearWeight synthetic_nvfp4(std::string name, int64_t N, int64_t K, uint64_t seed);
LinearWeight synthetic_fp8(std::string name, int64_t N, int64_t K, uint64_t seed);
LinearWeight synthetic_bf16(std::string name, int64_t N, int64_t K, uint64_t seed);

}  // namespace cm
