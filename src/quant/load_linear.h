// Resolving a linear layer's tensors in a checkpoint into a LinearWeight in
// its stored format. The format is decided per tensor by what is stored
// (spec §9): a float weight alone; FP8 E4M3 + `.scale` (128x128 blocks);
// I8/U8 packed E2M1 + E8M0 `.scale` per 32 (MXFP4); U8 packed E2M1 +
// `weight_scale` E4M3 per 16 + `weight_scale_2` (+ `input_scale`) (NVFP4).
// Shapes are checked against the expected [N, K]; errors name the tensor.
#pragma once
#include <string>

#include "io/safetensors.h"
#include "ops/linear.h"

namespace cm {

struct LinearLoadOptions {
  // NVFP4 checkpoints: allow a missing input_scale (derive it later) instead of failing.
  bool allow_missing_input_scale = false;
};

// prefix: the module name without ".weight", e.g. "model.layers.3.attn.wq_a".
LinearWeight load_linear(const TensorStore& store, const std::string& prefix, int64_t n, int64_t k,
                         const LinearLoadOptions& opt = {});

// True when the checkpoint stores a weight for this prefix.
bool has_linear(const TensorStore& store, const std::string& prefix);

}  // namespace cm
