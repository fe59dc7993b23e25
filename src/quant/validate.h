// Checkpoint validation, run before any weight is used (spec §9, lessons.md:
// a bad or missing activation scale must never turn into NaN at run time).
// Every problem is reported, not only the first, each on one line naming the
// tensor; the caller throws with all lines when the list is non-empty.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "quant/load_linear.h"

namespace cm {

// Scans every tensor of the checkpoint: each quantized linear weight has its
// scales, with consistent shapes and dtypes; FP8 weights and E4M3 block
// scales hold no NaN code (0x7F/0xFF); E8M0 scales no 0xFF; F32 block scales
// finite and > 0; weight_scale_2 and input_scale finite and > 0; a routed
// expert's missing input_scale is an error naming layer and expert unless
// opt.allow_missing_input_scale and another expert of the layer gives one;
// scale tensors without a weight are reported too. Routed experts outside
// [experts_first, experts_end) are skipped (expert parallelism: another rank's
// experts are never read).
std::vector<std::string> validate_checkpoint(const TensorStore& store, const LinearLoadOptions& opt,
                                             int64_t experts_first = 0, int64_t experts_end = INT64_MAX);

// Checks a config's quantization_config against what is stored: recognised
// method (modelopt NVFP4; MIXED_PRECISION with moe_quant_algo NVFP4; fp8 with
// weight_block_size [128,128]), group_size 16 for NVFP4, and that modules
// matched by ignore / exclude_modules (wildcards '*' and '?') are not NVFP4
// while the others the config declares NVFP4 are. qcfg may be null (no
// quantization declared: then no tensor may be quantized).
std::vector<std::string> check_quant_config(const nlohmann::json& qcfg, const TensorStore& store);

// Glob match with '*' (any run, including '.') and '?' (one character), the
// convention of ModelOpt's ignore lists.
bool glob_match(const std::string& pattern, const std::string& text);

}  // namespace cm
