// What `clawmine inspect` reports about a checkpoint directory: a config
// summary, a table of module groups x stored format x parameters x bytes,
// NVFP4 coverage of the linear parameters, the total size, and the same
// validation the loader runs (every problem listed). Built as JSON so the
// CLI prints it either as text or as --json.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "quant/load_linear.h"

namespace cm {

// Module group of a tensor or module name: layer and expert numbers folded
// into '*' and a leading "model." dropped ("layers.*.ffn.experts.*.w1").
std::string module_group(const std::string& name);

// Keys: "config" (object, or "config_error"), "groups" (array of {group,
// format, modules, params, bytes}), "linear_params", "nvfp4_params",
// "nvfp4_coverage" (fraction), "total_bytes", "problems" (array of strings).
nlohmann::json inspect_checkpoint(const std::string& dir, const LinearLoadOptions& opt);

// Human-readable rendering of inspect_checkpoint's result.
std::string inspect_text(const nlohmann::json& report);

}  // namespace cm
