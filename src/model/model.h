// The DeepSeek-V4 model on the CPU: Config + Weights (+ the mapped checkpoint
// they point into) and the forward pass over a chunk of tokens with a
// per-sequence State. forward.cpp reads top to bottom; attention.cpp and
// moe.cpp hold the two block kinds.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "model/config.h"
#include "model/observer.h"
#include "model/state.h"
#include "model/weights.h"
#include "ops/rope.h"

namespace cm {

struct Model {
  Config config;
  TensorStore store;  // the mmap'd checkpoint the weights point into
  Weights weights;
  RopeTable rope_main;      // sliding-window layers
  RopeTable rope_compress;  // CSA/HCA layers (YaRN when configured)
};

std::unique_ptr<Model> model_load(const std::string& dir, const LoadOptions& opt = {});

struct ForwardOptions {
  bool all_logits = false;        // logits for every token of the chunk, else only the last
  Observer* observer = nullptr;   // sees every named intermediate
  ActQuant act_quant = ActQuant::NONE;
};

// Feeds tokens[0:n] at positions state.pos … state.pos+n−1 and advances the
// state. Returns logits [n, vocab] (all_logits) or [vocab] (last token).
std::vector<float> forward(const Model& m, State& state, const int32_t* tokens, int64_t n,
                           const ForwardOptions& opt = {});

// Block functions used by forward(); x is the normed block input [T, D].
void attention_block(const Model& m, int64_t layer, LayerState& st, int64_t pos0, const float* x, int64_t T,
                     float* out, const ForwardOptions& opt);
// Routing (spec §7): for each token the K global expert ids (hash table or
// top-K of sqrt(softplus(logits)) + bias, ties to the lower id) and their
// weights s/Σs · routed_scaling_factor. logits [T, E]; out idx/weights [T, K].
void moe_route(const Config& c, const LayerWeights& lw, const int32_t* tokens, const float* logits, int64_t T,
               std::vector<int32_t>* idx, std::vector<float>* weights);
void moe_block(const Model& m, int64_t layer, const int32_t* tokens, const float* x, int64_t T, float* out,
               const ForwardOptions& opt);

}  // namespace cm
