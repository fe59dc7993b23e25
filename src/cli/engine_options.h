// The options every model-running command shares, in one struct fed by CLI
// flags (an environment mirror is declared next to its flag, nowhere else),
// and the default model: `-m` means the same in every command (a checkpoint
// directory; left out, the embedded default model installed next to the
// binary; given empty, an error).
#pragma once
#include <CLI/CLI.hpp>
#include <memory>
#include <string>

#include "runtime/sizing.h"

#include "seam/backend.h"
#include "model/model.h"
#include "sampling/sampler.h"

namespace cm::cli {

struct EngineOptions {
  std::string model;               // -m, --model DIR                     env CLAWMINE_MODEL
  int threads = 0;                 // -t, --threads (0 = free cores)      env CLAWMINE_THREADS
  bool layer_stats = false;        // --layer-stats
  bool derive_input_scale = false; // --derive-input-scale (NVFP4)
  std::string act_quant = "none";  // --act-quant none|nvfp4
  int64_t ctx_size = 0;            // context a sequence may reach (0 = the model's, at most 4096)
  std::string device = "auto";     // --device auto|cpu|cuda (auto: cuda when a GPU is present)
  double gpu_memory_utilization = 0.9;  // --gpu-memory-utilization U   env CLAWMINE_GPU_MEMORY_UTILIZATION
  bool enforce_eager = false;      // --enforce-eager (CUDA: no graphs)   env CLAWMINE_ENFORCE_EAGER
  bool concurrent_branches = true; // --no-concurrent-branches (CUDA: one stream)   env CLAWMINE_CONCURRENT_BRANCHES
  bool fast_prefill = false;       // --fast-prefill (CUDA: not batch-invariant)   env CLAWMINE_FAST_PREFILL
  std::string kv_cache_dtype = "auto"; // --kv-cache-dtype auto|fp8|fp8_e4m3   env CLAWMINE_KV_CACHE_DTYPE
  bool sample_on_device = true;    // --sample-on-device / --no-sample-on-device   env CLAWMINE_SAMPLE_ON_DEVICE
  int32_t mtp = 0;                 // --mtp K (generate, chat, serve): MTP drafts per step   env CLAWMINE_MTP
  std::string load_format = "auto"; // --load-format auto|dummy (dummy: random weights of config.json's shape)
  int64_t num_layers = 0;          // --num-layers N (dummy weights: the first N layers; 0 = all)
  // Set by the multi-GPU launch (serve --gpus, cli/serve_ranks.h), not by flags: this rank's routed
  // experts, its GPU and the expert-parallel communicator.
  ExpertRange experts;
  int cuda_device = 0;
  Comm* ep_comm = nullptr;
  CLI::Option* model_flag = nullptr;
  double load_seconds = 0;         // set by load_model
  int threads_used = 0;            // set by load_model
};

// The embedded default model: share/clawmine/models/default found relative to
// the running binary (bin/../share/... when installed, ./share/... in the build
// tree). Fails naming the places looked at when it is in none of them.
std::string default_model_dir();

// Declares -m/--model (optional: the default model when left out).
CLI::Option* add_model_option(CLI::App& app, std::string& model, CLI::Option** flag);
// The directory a command uses: the -m value, or the default model; `-m ''` is an error.
std::string resolve_model(const std::string& model, const CLI::Option* flag);

// Declares the shared flags on a subcommand.
void add_engine_options(CLI::App& app, EngineOptions& o);

// Declares --mtp on the commands that generate (generate, chat, serve).
void add_mtp_option(CLI::App& app, EngineOptions& o);

// The sampling flags (llama.cpp spelling) bound to sp; the seed is separate
// because -1 (the default) means a random one.
void add_sampling_options(CLI::App& app, SamplingParams& sp, int64_t& seed);

// The sampling parameters for a run: the model's generation_config.json
// defaults, overridden by the sampling flags given on the command line; the
// seed is `seed`, or a random one when it is -1 (the result holds the one used).
SamplingParams effective_sampling(const CLI::App& app, const SamplingParams& flags, int64_t seed,
                                  const std::string& model_dir);

// Checks -s before a model loads: -1 (random) or a value >= 0.
void check_seed(int64_t seed);

// Applies threads, loads the model (o.model is set to the directory used and
// o.load_seconds to the time taken). On a terminal, stderr shows what is
// being loaded and when it is done.
std::unique_ptr<Model> load_model(EngineOptions& o);
// The backend for these flags (`stats` observes when --layer-stats is on),
// reserved for `shape`. shape.max_ctx = 0 takes context_size(o, m).
// Where the model runs: --device cpu|cuda, or auto (cuda when a GPU is present).
Device resolved_device(const EngineOptions& o);
std::unique_ptr<ModelBackend> make_backend(const EngineOptions& o, const Model& m, Observer* stats, CacheShape shape);
// The backend before reserve() (the multi-GPU launch reserves it through a LeaderBackend).
std::unique_ptr<ModelBackend> unreserved_backend(const EngineOptions& o, const Model& m, Observer* stats);
// The same with the shape chosen by runtime::size_reservation (what `sizing` leaves at 0 follows from
// the device's memory); the shape reserved, and why, in *sized.
std::unique_ptr<ModelBackend> make_backend(const EngineOptions& o, const Model& m, Observer* stats,
                                           const runtime::SizingRequest& sizing, runtime::Sizing* sized);
// The context a sequence may reach: o.ctx_size, or the model's context capped at 4096.
int64_t context_size(const EngineOptions& o, const Model& m);

}  // namespace cm::cli
