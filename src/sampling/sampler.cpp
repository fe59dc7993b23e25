// Validation of a request's sampling parameters (sampler.h).
#include "sampling/sampler.h"

#include <cmath>

#include "common/error.h"

namespace cm {

void validate_sampling_params(const SamplingParams& p) {
  CM_CHECK(std::isfinite(p.temperature) && p.temperature >= 0.0f,
           "sampling: temperature must be a finite number >= 0 (got {})", p.temperature);
  CM_CHECK(p.top_k >= 0, "sampling: top_k must be >= 0 (0 = off), got {}", p.top_k);
  CM_CHECK(std::isfinite(p.top_p) && p.top_p > 0.0f && p.top_p <= 1.0f,
           "sampling: top_p must be in (0, 1] (got {})", p.top_p);
  CM_CHECK(std::isfinite(p.min_p) && p.min_p >= 0.0f && p.min_p <= 1.0f,
           "sampling: min_p must be in [0, 1] (got {})", p.min_p);
  CM_CHECK(std::isfinite(p.repetition_penalty) && p.repetition_penalty > 0.0f,
           "sampling: repetition_penalty must be a finite number > 0 (got {})", p.repetition_penalty);
  CM_CHECK(std::isfinite(p.presence_penalty),
           "sampling: presence_penalty must be finite (got {})", p.presence_penalty);
  CM_CHECK(std::isfinite(p.frequency_penalty),
           "sampling: frequency_penalty must be finite (got {})", p.frequency_penalty);
  for (const auto& [id, bias] : p.logit_bias)
    CM_CHECK(std::isfinite(bias), "sampling: logit_bias of token {} must be finite (got {})", id, bias);
}

}  // namespace cm
