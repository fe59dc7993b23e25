// A request's sampling parameters (OpenAI / vLLM / llama.cpp fields) and their validation. The draw
// itself is ops/sample.h's row sampler, one algorithm on the host (runtime/row_sampler.h, used by the
// engine) and on a device that samples where its logits are: logit bias, then the penalties on ids
// seen in prompt + output (repetition r: logit > 0 ? logit / r : logit * r, once per distinct id;
// OpenAI: logit -= count * frequency + presence), then greedy (temperature 0, lowest id on ties) or
// temperature, top-k, top-p and min-p as thresholds on integer token weights and a Philox draw keyed
// by (seed, position), so a seed gives the same tokens on every platform and in any batch.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

namespace cm {

struct SamplingParams {
  float temperature = 0.0f;         // 0 = greedy (argmax, lowest id on ties)
  int top_k = 0;                    // 0 = off
  float top_p = 1.0f;               // 1 = off
  float min_p = 0.0f;               // 0 = off
  float repetition_penalty = 1.0f;  // llama.cpp/HF semantics on previously seen ids
  float presence_penalty = 0.0f, frequency_penalty = 0.0f;  // OpenAI semantics
  uint64_t seed = 0;
  std::vector<std::pair<int32_t, float>> logit_bias;  // (token id, added to its logit); ids outside the vocab are ignored
};

// Throws cm::Error naming the first bad field (checked when a request is parsed and when a job's
// sampler is made).
void validate_sampling_params(const SamplingParams& p);

}  // namespace cm
