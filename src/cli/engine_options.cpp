#include "cli/engine_options.h"

#include <omp.h>

#include "common/error.h"

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
}

std::unique_ptr<Model> load_model(EngineOptions& o) {
  if (o.model.empty()) o.model = CLAWMINE_DEFAULT_MODEL;
  if (o.threads > 0) omp_set_num_threads(o.threads);
  LoadOptions lo;
  lo.linear.allow_missing_input_scale = o.derive_input_scale;
  return model_load(o.model, lo);
}

ForwardOptions forward_options(const EngineOptions& o, Observer* stats) {
  ForwardOptions fo;
  fo.observer = o.layer_stats ? stats : nullptr;
  fo.act_quant = o.act_quant == "nvfp4" ? ActQuant::NVFP4 : ActQuant::NONE;
  return fo;
}

}  // namespace cm::cli
