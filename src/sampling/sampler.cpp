// Sampler implementation; the contract (order of operations, error cases) is in sampler.h.
#include "sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstring>

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

// Probabilities are positive floats, whose bit patterns sort like their values: the top 12 bits
// (exponent + 3 mantissa bits) give 1024 monotone buckets.
static inline uint32_t bucket_of(float p) {
  uint32_t bits;
  std::memcpy(&bits, &p, sizeof bits);
  return bits >> 20;
}

template <class Enough>
void Sampler::keep_top(int64_t vocab, Enough enough) {
  constexpr int kBuckets = 1024;
  int64_t count[kBuckets] = {};
  double mass[kBuckets] = {};
  for (const Cand& c : cand_) {
    uint32_t b = bucket_of(c.p);
    ++count[b];
    mass[b] += c.p;
  }
  // Walk down from the most probable bucket to the one where the condition becomes true.
  int64_t n = 0;
  double m = 0.0;
  int boundary = -1;
  for (int b = kBuckets - 1; b >= 0; --b) {
    if (enough(n + count[b], m + mass[b])) {
      boundary = b;
      break;
    }
    n += count[b];
    m += mass[b];
  }
  if (boundary < 0) return;  // everything is needed
  // Inside the boundary bucket take tokens in rank order until the condition holds.
  boundary_.clear();
  for (const Cand& c : cand_)
    if (bucket_of(c.p) == static_cast<uint32_t>(boundary)) boundary_.push_back(c);
  std::sort(boundary_.begin(), boundary_.end(), ranks_before);
  keep_.resize(vocab, 0);
  for (const Cand& c : boundary_) {
    keep_[c.id] = 1;
    ++n;
    m += c.p;
    if (enough(n, m)) break;
  }
  size_t w = 0;
  for (const Cand& c : cand_) {
    uint32_t b = bucket_of(c.p);
    if (b > static_cast<uint32_t>(boundary) || (b == static_cast<uint32_t>(boundary) && keep_[c.id])) cand_[w++] = c;
  }
  cand_.resize(w);
  for (const Cand& c : boundary_) keep_[c.id] = 0;
}

int32_t Sampler::sample(const float* logits, int64_t vocab, const std::vector<int32_t>& history,
                        const std::vector<int32_t>& banned) {
  CM_CHECK(logits != nullptr, "sampling: no logits given");
  CM_CHECK(vocab > 0 && vocab <= INT32_MAX, "sampling: vocabulary size {} is invalid", vocab);
  // NaN and +inf in one vectorisable pass; locate the first offender only on failure.
  bool bad = false;
  for (int64_t i = 0; i < vocab; ++i) bad |= !(logits[i] < INFINITY);
  if (bad) {
    for (int64_t i = 0; i < vocab; ++i)
      CM_CHECK(logits[i] < INFINITY, "sampling: logit {} is {}", i, std::isnan(logits[i]) ? "NaN" : "+inf");
  }
  const float* l = logits;
  const SamplingParams& p = params_;
  const bool penalties = p.repetition_penalty != 1.0f || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f;
  if (penalties || !p.logit_bias.empty()) {
    work_.assign(logits, logits + vocab);
    // The bias comes first (as vLLM applies it), so a repetition penalty divides a biased logit.
    for (const auto& [id, bias] : p.logit_bias)
      if (id >= 0 && id < vocab) work_[size_t(id)] += bias;
    if (penalties) apply_penalties(vocab, history);
    l = work_.data();
  }
  if (!banned.empty()) {
    // Banned ids (a request's min_tokens keeps EOS out) are -inf after the penalties, as if the
    // model had never proposed them; the copy is made only when something is banned.
    if (l != work_.data()) work_.assign(logits, logits + vocab);
    for (int32_t id : banned)
      if (id >= 0 && id < vocab) work_[size_t(id)] = -INFINITY;
    l = work_.data();
  }

  // Greedy: first maximum wins, so ties go to the lowest id.
  int32_t best = -1;
  float best_l = -INFINITY;
  for (int64_t i = 0; i < vocab; ++i)
    if (l[i] > best_l) best_l = l[i], best = static_cast<int32_t>(i);
  CM_CHECK(best >= 0, "sampling: every logit is -inf, nothing can be sampled");
  if (p.temperature == 0.0f) return best;

  // Candidates with non-negligible probability, in id order: p = exp((l - max) / T) in (0, 1].
  const float inv_t = 1.0f / p.temperature;
  const float floor_l = best_l - 45.0f * p.temperature;
  cand_.clear();
  for (int64_t i = 0; i < vocab; ++i)
    if (l[i] >= floor_l) cand_.push_back({std::exp((l[i] - best_l) * inv_t), static_cast<int32_t>(i)});
  if (p.top_k > 0 && static_cast<size_t>(p.top_k) < cand_.size()) {
    const int64_t k = p.top_k;
    keep_top(vocab, [k](int64_t n, double) { return n >= k; });
  }
  if (p.top_p < 1.0f) {
    double total = 0.0;
    for (const Cand& c : cand_) total += c.p;
    const double need = static_cast<double>(p.top_p) * total;
    keep_top(vocab, [need](int64_t, double m) { return m >= need; });
  }
  if (p.min_p > 0.0f) {
    // p_max is exp(0) = 1: the argmax survives every filter above.
    cand_.erase(std::remove_if(cand_.begin(), cand_.end(), [&](const Cand& c) { return c.p < p.min_p; }),
                cand_.end());
  }

  double total = 0.0;
  for (const Cand& c : cand_) total += c.p;
  const double target = next_uniform() * total;
  double cum = 0.0;
  for (const Cand& c : cand_) {
    cum += c.p;
    if (cum > target) return c.id;
  }
  return cand_.back().id;
}

}  // namespace cm
