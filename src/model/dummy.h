// --load-format dummy (vLLM's name): a model of a config.json's shape with random weights in the release
// formats (model/synthetic.h: NVFP4 routed experts, FP8 attention and shared expert, BF16 router,
// compressors, embedding and head), nothing read but config.json. For measuring real shapes without the
// checkpoint: serving at V4-Flash or V4-Pro size on one GPU with --num-layers, load tests, memory plans.
// The CUDA backend generates the weights on the device a layer at a time (bench/bench_model.h's
// synthetic_dev_model); the CPU backend gets them on the host (small configs, or a few layers).
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "model/config.h"
#include "model/model.h"

namespace cm {

// The config's first n layers (n = 0: all): the per-layer kinds and ratios cut to n; the MTP blocks kept.
// Fails naming the range when n is outside [0, num_layers].
Config keep_first_layers(Config c, int64_t n);

// Host bytes of a dummy model's weights (an estimate within a few percent: the routed experts, the FP8
// and BF16 linears, the embedding and head).
size_t dummy_host_bytes(const Config& c);

// A Model of config c: host_weights = every weight generated here (the CPU backend's; fails naming the
// bytes when they exceed what the host can hold), else the config and RoPE tables only (for a backend that
// generates its weights itself).
std::unique_ptr<Model> dummy_model(const Config& c, bool host_weights, uint64_t seed = 1);

}  // namespace cm
