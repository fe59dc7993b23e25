// The DeepSeek-V4 model as plain data: Config + Weights (+ the mapped
// checkpoint they point into) + the RoPE tables. Running it is a backend's job
// (engine/backend.h): the CPU backend is model/cpu_backend.{h,cpp}.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "model/config.h"
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

// Reads config.json, maps the checkpoint, validates every tensor (all problems
// reported at once) and builds the weights.
std::unique_ptr<Model> model_load(const std::string& dir, const LoadOptions& opt = {});

}  // namespace cm
