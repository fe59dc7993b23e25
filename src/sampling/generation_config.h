// Sampling defaults from a model's generation_config.json (HF convention, style-and-ecosystem
// B.4): temperature, top_p, top_k, repetition_penalty, do_sample, max_new_tokens and the EOS ids
// (a number or a list; generation stops on any of them). CLI flags / request fields override these.
// HF semantics for do_sample: absent or false means greedy (temperature 0) whatever temperature says.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "sampling/sampler.h"

namespace cm {

struct GenerationDefaults {
  SamplingParams sampling;            // greedy when the file is absent
  std::vector<int32_t> eos_ids;       // empty when the file names none
  std::optional<int> max_new_tokens;  // unset when the file names none
};

// Reads DIR/generation_config.json if it exists (missing file -> defaults). cm::Error on a
// malformed file or out-of-range values.
GenerationDefaults load_generation_config(const std::string& dir);
GenerationDefaults parse_generation_config(const std::string& json_text);

}  // namespace cm
