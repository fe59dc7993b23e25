// Fuzz target: config.json and generation_config.json text. Every input goes through both
// parsers (config_parse, which config_load uses, and parse_generation_config, which
// load_generation_config uses), then what the model does with an accepted config at load time:
// the quantization_config check and the RoPE tables. Checks: per-layer tables have one entry
// per layer, RoPE frequencies are finite.
#include <cmath>

#include "common/error.h"
#include "fuzz_util.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "quant/validate.h"
#include "sampling/generation_config.h"

using cm::fuzz::fuzz_check;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text = cm::fuzz::as_text(data, size);
  try {
    cm::Config c = cm::config_parse(text, "fuzz/config.json");
    fuzz_check(int64_t(c.attn_kinds.size()) == c.num_layers, "attn_kinds size != num_layers");
    fuzz_check(int64_t(c.moe_kinds.size()) == c.num_layers, "moe_kinds size != num_layers");
    for (int64_t l = 0; l < c.num_layers; ++l) (void)c.ratio(l);
    (void)cm::check_quant_config(c.quantization, cm::TensorStore{});
    for (const cm::RopeConfig* r : {&c.rope_main, &c.rope_compress})
      for (float f : cm::rope_frequencies(*r, c.rope_dim)) fuzz_check(std::isfinite(f), "non-finite RoPE frequency");
  } catch (const cm::Error&) {
  }
  try {
    cm::GenerationDefaults g = cm::parse_generation_config(std::string(text));
    cm::validate_sampling_params(g.sampling);  // what the parser accepted must be usable
  } catch (const cm::Error&) {
  }
  return 0;
}
