// Sampler implementation; the contract (order of operations, error cases) is in sampler.h.
#include "sampling/sampler.h"

#include <algorithm>
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
}

Sampler::Sampler(const SamplingParams& p) : params_(p), rng_(p.seed) { validate_sampling_params(p); }

void Sampler::reseed(uint64_t seed) {
  params_.seed = seed;
  rng_.seed(seed);
}

// 53 random bits -> a double in [0,1); exact and identical on every platform.
double Sampler::next_uniform() { return static_cast<double>(rng_() >> 11) * 0x1.0p-53; }

// Penalties act on the distinct ids of the history; counting uses a sorted copy so the cost is
// O(h log h) regardless of the vocabulary size.
void Sampler::apply_penalties(int64_t vocab, const std::vector<int32_t>& history) {
  const SamplingParams& p = params_;
  if (p.repetition_penalty == 1.0f && p.presence_penalty == 0.0f && p.frequency_penalty == 0.0f)
    return;
  hist_.assign(history.begin(), history.end());
  std::sort(hist_.begin(), hist_.end());
  for (size_t i = 0; i < hist_.size();) {
    int32_t id = hist_[i];
    size_t j = i;
    while (j < hist_.size() && hist_[j] == id) ++j;
    CM_CHECK(id >= 0 && id < vocab, "sampling: history token id {} outside the vocabulary [0, {})",
             id, vocab);
    float count = static_cast<float>(j - i);
    float& l = work_[id];
    if (p.repetition_penalty != 1.0f) l = l > 0.0f ? l / p.repetition_penalty : l * p.repetition_penalty;
    l -= count * p.frequency_penalty + p.presence_penalty;
    i = j;
  }
}

int32_t Sampler::sample(const float* logits, int64_t vocab, const std::vector<int32_t>& history) {
  CM_CHECK(logits != nullptr, "sampling: no logits given");
  CM_CHECK(vocab > 0 && vocab <= INT32_MAX, "sampling: vocabulary size {} is invalid", vocab);
  work_.resize(vocab);
  for (int64_t i = 0; i < vocab; ++i) {
    float l = logits[i];
    CM_CHECK(!std::isnan(l), "sampling: logit {} is NaN", i);
    CM_CHECK(l != INFINITY, "sampling: logit {} is +inf", i);
    work_[i] = l;
  }
  apply_penalties(vocab, history);

  // Greedy: first maximum wins, so ties go to the lowest id.
  int32_t best = -1;
  float best_l = -INFINITY;
  for (int64_t i = 0; i < vocab; ++i)
    if (work_[i] > best_l) best_l = work_[i], best = static_cast<int32_t>(i);
  CM_CHECK(best >= 0, "sampling: every logit is -inf, nothing can be sampled");
  if (params_.temperature == 0.0f) return best;

  // Unnormalised probabilities exp((l - max) / T) of every finite candidate.
  const double inv_t = 1.0 / params_.temperature;
  cand_.clear();
  prob_.assign(vocab, 0.0);
  for (int64_t i = 0; i < vocab; ++i) {
    if (work_[i] == -INFINITY) continue;
    cand_.push_back(static_cast<int32_t>(i));
    prob_[i] = std::exp((static_cast<double>(work_[i]) - best_l) * inv_t);
  }
  auto more_probable = [this](int32_t a, int32_t b) {
    return prob_[a] != prob_[b] ? prob_[a] > prob_[b] : a < b;
  };
  if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < cand_.size()) {
    std::nth_element(cand_.begin(), cand_.begin() + params_.top_k, cand_.end(), more_probable);
    cand_.resize(params_.top_k);
    // nth_element leaves an implementation-defined order; sort the k kept ids so the final walk
    // is the same with every standard library.
    std::sort(cand_.begin(), cand_.end(), more_probable);
  }
  if (params_.top_p < 1.0f) {
    double total = 0.0;
    for (int32_t id : cand_) total += prob_[id];
    const double need = params_.top_p * total;
    // Sort a growing prefix until it holds the nucleus: the nucleus is usually small, so a full
    // sort of the 129k vocabulary is rarely needed.
    size_t m = std::min<size_t>(cand_.size(), 256);
    for (;;) {
      std::partial_sort(cand_.begin(), cand_.begin() + m, cand_.end(), more_probable);
      double cum = 0.0;
      size_t keep = 0;
      while (keep < m && cum < need) cum += prob_[cand_[keep++]];
      if (cum >= need || m == cand_.size()) {
        cand_.resize(std::max<size_t>(keep, 1));
        break;
      }
      m = std::min(cand_.size(), m * 8);
    }
  }
  if (params_.min_p > 0.0f) {
    // p_max of the kept set is exp(0) = 1 here (the argmax always survives top-k/top-p).
    const double threshold = params_.min_p * prob_[best];
    cand_.erase(std::remove_if(cand_.begin(), cand_.end(),
                               [&](int32_t id) { return prob_[id] < threshold; }),
                cand_.end());
  }

  // Walk the kept tokens in their (deterministic) order: probability order after top-k/top-p,
  // id order otherwise.
  double total = 0.0;
  for (int32_t id : cand_) total += prob_[id];
  const double target = next_uniform() * total;
  double cum = 0.0;
  for (int32_t id : cand_) {
    cum += prob_[id];
    if (cum > target) return id;
  }
  return cand_.back();
}

}  // namespace cm
