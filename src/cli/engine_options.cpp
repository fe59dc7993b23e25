#include "cli/engine_options.h"

#include <omp.h>

#include <cstdio>

#include "common/error.h"
#include "sampling/generation_config.h"

namespace cm::cli {

void add_engine_options(CLI::App& app, EngineOptions& o, bool model_required) {
  auto* m = app.add_option("-m,--model", o.model, "Checkpoint directory (config.json + *.safetensors)")
                ->envname("CLAWMINE_MODEL");
  if (model_required) m->required();
  else m->default_str(CLAWMINE_DEFAULT_MODEL);
  app.add_option("-t,--threads", o.threads, "CPU threads (0 = all cores)")->envname("CLAWMINE_THREADS")
      ->check(CLI::Range(0, 4096));
  app.add_flag("--layer-stats", o.layer_stats,
               "After every layer print amax/mean/NaN/Inf of each residual stream and of the attention and MoE "
               "outputs (stderr)");
  app.add_flag("--derive-input-scale", o.derive_input_scale,
               "NVFP4: derive a missing per-expert input_scale (max over the layer's experts) instead of failing");
  app.add_option("--act-quant", o.act_quant,
                 "Activation handling for NVFP4 weights: none (weight-only, fp32 activations) or nvfp4 (emulate a "
                 "W4A4 Blackwell kernel)")
      ->check(CLI::IsMember({"none", "nvfp4"}));
  app.add_option("--device", o.device, "Where the model runs: auto (cuda when a GPU is present), cpu or cuda")
      ->envname("CLAWMINE_DEVICE")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
}

void add_sampling_options(CLI::App& app, SamplingParams& sp) {
  app.add_option("--temp", sp.temperature, "Temperature (0 = greedy; default from generation_config.json, else greedy)");
  app.add_option("--top-k", sp.top_k, "Top-k (0 = off)");
  app.add_option("--top-p", sp.top_p, "Top-p (1 = off)");
  app.add_option("--min-p", sp.min_p, "Min-p (0 = off)");
  app.add_option("--repeat-penalty", sp.repetition_penalty, "Repetition penalty (1 = off)");
  app.add_option("--presence-penalty", sp.presence_penalty, "Presence penalty");
  app.add_option("--frequency-penalty", sp.frequency_penalty, "Frequency penalty");
  app.add_option("-s,--seed", sp.seed, "Random seed");
}

SamplingParams effective_sampling(const CLI::App& app, const SamplingParams& f, const std::string& model_dir) {
  SamplingParams sp = load_generation_config(model_dir).sampling;
  auto given = [&](const char* flag) { return app.count(flag) > 0; };
  if (given("--temp")) sp.temperature = f.temperature;
  if (given("--top-k")) sp.top_k = f.top_k;
  if (given("--top-p")) sp.top_p = f.top_p;
  if (given("--min-p")) sp.min_p = f.min_p;
  if (given("--repeat-penalty")) sp.repetition_penalty = f.repetition_penalty;
  if (given("--presence-penalty")) sp.presence_penalty = f.presence_penalty;
  if (given("--frequency-penalty")) sp.frequency_penalty = f.frequency_penalty;
  sp.seed = f.seed;
  validate_sampling_params(sp);
  return sp;
}

std::unique_ptr<Model> load_model(EngineOptions& o) {
  if (o.model.empty()) o.model = CLAWMINE_DEFAULT_MODEL;
  if (o.threads > 0) omp_set_num_threads(o.threads);
  LoadOptions lo;
  lo.linear.allow_missing_input_scale = o.derive_input_scale;
  return model_load(o.model, lo);
}

int64_t context_size(const EngineOptions& o, const Model& m) {
  const int64_t model_ctx = m.config.max_position_embeddings;
  if (o.ctx_size < 0) fail("--ctx-size must be >= 0 (got {})", o.ctx_size);
  if (o.ctx_size > model_ctx) fail("--ctx-size {} exceeds the model's context of {}", o.ctx_size, model_ctx);
  return o.ctx_size > 0 ? o.ctx_size : std::min<int64_t>(model_ctx, 4096);
}

std::unique_ptr<ModelBackend> make_backend(const EngineOptions& o, const Model& m, Observer* stats, CacheShape shape) {
  BackendOptions bo;
  bo.observer = o.layer_stats ? stats : nullptr;
  bo.act_quant = o.act_quant == "nvfp4" ? ActQuant::NVFP4 : ActQuant::NONE;
  const Device d = o.device == "cpu"    ? Device::CPU
                   : o.device == "cuda" ? Device::CUDA
                                        : (gpu_present() ? Device::CUDA : Device::CPU);
  std::fprintf(stderr, "clawmine: running on %s%s\n", device_name(d), o.device == "auto" ? " (--device auto)" : "");
  std::unique_ptr<ModelBackend> be = cm::make_backend(m, d, bo);
  if (shape.max_ctx == 0) shape.max_ctx = context_size(o, m);
  be->reserve(shape);
  return be;
}

}  // namespace cm::cli
