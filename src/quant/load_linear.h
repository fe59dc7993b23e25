// Resolving a linear layer's tensors in a checkpoint into a LinearWeight in
// its stored format. The format is decided per tensor by what is stored
// (spec §9):
//   float weight alone (F32/BF16/F16)                                  -> F32/BF16/F16
//   F8_E4M3 weight + `.scale` or `.weight_scale_inv` (E8M0 or F32,
//     [ceil(N/128), ceil(K/128)])                                       -> FP8_BLOCK
//   I8/U8 packed [N, K/2] + E8M0 `.scale` [N, K/32]                    -> MXFP4
//   I8/U8 packed [N, K/2] + E4M3 `.weight_scale` [N, K/16]
//     + F32 scalar `.weight_scale_2` + F32 scalar `.input_scale`        -> NVFP4
// The weight keeps pointing into the mmap; nothing is dequantized at load.
// Shapes and scalar scales are checked here (errors name the tensor); the
// full scan of every scale value is validate_checkpoint's job (validate.h).
#pragma once
#include <optional>
#include <functional>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "ops/linear.h"

namespace cm {

struct LinearLoadOptions {
  // NVFP4 checkpoints: a routed expert without `input_scale` gets the max of
  // the same projection kind's input_scale over the layer's other experts
  // (w1/w3 share one, w2 its own) instead of failing (--derive-input-scale).
  bool allow_missing_input_scale = false;
  // Called by validate_checkpoint as linears are checked (done of total, one
  // call at a time, from any thread): the CLI's loading progress on a terminal.
  std::function<void(size_t done, size_t total)> on_validated;
};

// prefix: the module name without ".weight", e.g. "model.layers.3.attn.wq_a".
LinearWeight load_linear(const TensorStore& store, const std::string& prefix, int64_t n, int64_t k,
                         const LinearLoadOptions& opt = {});

// True when the checkpoint stores a weight for this prefix.
bool has_linear(const TensorStore& store, const std::string& prefix);

// The stored format of the linear at prefix, decided from the tensors present
// (nullopt when there is no weight or the combination is not a known format).
std::optional<WeightFormat> stored_linear_format(const TensorStore& store, const std::string& prefix);

// Every structural problem of the linear at prefix (missing/misshaped scales,
// bad dtypes, non-finite or non-positive scalar scales, missing input_scale),
// one line each naming the tensor. n/k < 0: take them from the stored weight.
// scan_values also scans every block scale (and FP8 weight) byte.
std::vector<std::string> linear_problems(const TensorStore& store, const std::string& prefix, int64_t n, int64_t k,
                                         const LinearLoadOptions& opt, bool scan_values);

// Routed expert prefixes ("<base>.experts.<E>.<proj>"): the layer's max
// input_scale over the other experts of the same projection kind, if any
// expert of that kind stores a finite, positive one.
std::optional<float> derive_input_scale(const TensorStore& store, const std::string& prefix);

// Parses "<...>layers.<L>.<...>.experts.<E>.<proj>"; false when prefix is not a routed expert.
struct ExpertName {
  std::string base;  // everything before ".<E>."
  int64_t layer = -1;
  int64_t expert = -1;
  std::string proj;  // w1 / w2 / w3 (or gate_proj / up_proj / down_proj)
};
bool parse_expert_name(const std::string& prefix, ExpertName* out);

}  // namespace cm
