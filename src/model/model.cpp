// Loading a model directory: config, checkpoint validation, weights, RoPE tables.
#include "model/model.h"

#include "common/error.h"
#include "quant/validate.h"

namespace cm {

std::unique_ptr<Model> model_load(const std::string& dir, const LoadOptions& opt) {
  auto m = std::make_unique<Model>();
  m->config = config_load(dir);
  m->store = TensorStore::open_dir(dir);
  // Every problem of the checkpoint at once (scales, shapes, config), before any weight is used.
  std::vector<std::string> problems = validate_checkpoint(m->store, opt.linear);
  for (std::string& p : check_quant_config(m->config.quantization, m->store)) problems.push_back(std::move(p));
  if (!problems.empty()) {
    std::string msg = dir + ": checkpoint failed validation (" + std::to_string(problems.size()) + " problems):";
    for (const std::string& p : problems) msg += "\n  " + p;
    throw Error(msg);
  }
  m->weights = weights_load(m->store, m->config, opt);
  const Config& c = m->config;
  m->rope_main = RopeTable{rope_frequencies(c.rope_main, c.rope_dim), float(c.rope_main.attention_factor), c.rope_dim};
  m->rope_compress =
      RopeTable{rope_frequencies(c.rope_compress, c.rope_dim), float(c.rope_compress.attention_factor), c.rope_dim};
  return m;
}

}  // namespace cm
