// The options every model-running command shares, in one struct fed by CLI
// flags (an environment mirror is declared next to its flag, nowhere else).
// Commands: logits, generate (and later chat, serve, perplexity).
#pragma once
#include <CLI/CLI.hpp>
#include <memory>
#include <string>

#include "engine/backend.h"
#include "model/model.h"
#include "sampling/sampler.h"

namespace cm::cli {

struct EngineOptions {
  std::string model;               // -m, --model DIR
  int threads = 0;                 // -t, --threads (0 = all cores)       env CLAWMINE_THREADS
  bool layer_stats = false;        // --layer-stats
  bool derive_input_scale = false; // --derive-input-scale (NVFP4)
  std::string act_quant = "none";  // --act-quant none|nvfp4
  int64_t ctx_size = 0;            // context a sequence may reach (0 = the model's, at most 4096)
  std::string device = "auto";     // --device auto|cpu|cuda (auto: cuda when a GPU is present)
};

// Declares the shared flags on a subcommand. model_required: -m must be given.
void add_engine_options(CLI::App& app, EngineOptions& o, bool model_required = true);

// Declares the sampling flags (llama.cpp spelling) bound to sp.
void add_sampling_options(CLI::App& app, SamplingParams& sp);

// The sampling parameters for a run: the model's generation_config.json
// defaults, overridden by the sampling flags given on the command line.
SamplingParams effective_sampling(const CLI::App& app, const SamplingParams& flags, const std::string& model_dir);

// Applies threads, loads the model with the load options (the embedded
// default model when -m was not given; o.model is set to the path used).
std::unique_ptr<Model> load_model(EngineOptions& o);
// The backend for these flags (`stats` observes when --layer-stats is on),
// reserved for `shape`. shape.max_ctx = 0 takes context_size(o, m).
std::unique_ptr<ModelBackend> make_backend(const EngineOptions& o, const Model& m, Observer* stats, CacheShape shape);
// The context a sequence may reach: o.ctx_size, or the model's context capped at 4096.
int64_t context_size(const EngineOptions& o, const Model& m);

}  // namespace cm::cli
