// Token sampler: turns one row of logits into the next token id.
//
// Why hand-written: the chain must be bit-for-bit reproducible for a given seed on every
// platform, so the random stream is std::mt19937_64 (fully specified by the standard) and
// the uniform-float conversion is our own (std::uniform_real_distribution and
// std::discrete_distribution differ between standard libraries).
//
// Order of operations in sample() (HF transformers / vLLM order):
//   0. logit_bias (OpenAI): bias[id] is added to the raw logit (so -100 effectively bans an id and
//      +100 all but forces it); the penalties and temperature then act on the biased logits.
//   1. penalties on ids seen in `history` (prompt + generated so far):
//      repetition_penalty r (HF/llama.cpp): logit > 0 ? logit / r : logit * r, once per distinct id;
//      OpenAI penalties: logit -= count * frequency_penalty + (count > 0) * presence_penalty.
//   2. temperature == 0  -> greedy: argmax of the penalised logits, lowest id on ties.
//   3. otherwise logits / temperature, softmax, then the filters in this order:
//      top_k (keep the k most probable), top_p (keep the smallest most-probable set whose
//      probability mass reaches top_p), min_p (drop tokens with p < min_p * p_max).
//      Ties are ranked by lower id first, so the kept set is deterministic. At least one token
//      always survives. Tokens below exp(-45) of the most probable one (relative mass < 3e-20,
//      invisible in double arithmetic) are not considered at all.
//   4. draw u in [0,1) from the 53 high bits of the generator and walk the cumulative mass of the
//      kept tokens in ascending id order.
// Cost: O(vocab) per token: top-k/top-p select through a histogram of the probabilities' float
// exponents (only the one boundary bucket is sorted), so there is no full sort even when the
// nucleus holds most of a 129k vocabulary. Sums run in id order, the same on every platform.
// Errors (cm::Error): nonsensical parameters at construction; NaN or +inf logits, all logits
// -inf, vocab <= 0, or a history id outside [0, vocab) at sample().
//
// Usage:
//   cm::Sampler s(params);
//   std::vector<int32_t> hist = prompt_ids;
//   for (...) { int32_t id = s.sample(logits_row, vocab, hist); hist.push_back(id); }
#pragma once
#include <cstdint>
#include <random>
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

// Throws cm::Error naming the first bad field (used by the Sampler constructor; also handy for
// validating request parameters before a job starts).
void validate_sampling_params(const SamplingParams& p);

class Sampler {
 public:
  explicit Sampler(const SamplingParams& p);  // validates params -> cm::Error on nonsense
  // history = prompt + generated ids (only used by the penalties). banned: ids that must not be
  // picked (their logits count as -inf).
  int32_t sample(const float* logits, int64_t vocab, const std::vector<int32_t>& history,
                 const std::vector<int32_t>& banned = {});

  const SamplingParams& params() const { return params_; }
  // Restart the random stream (same seed -> same draws again).
  void reseed(uint64_t seed);
  // The next uniform double in [0,1) of the stream (exposed for tests).
  double next_uniform();

 private:
  void apply_penalties(int64_t vocab, const std::vector<int32_t>& history);
  struct Cand {
    float p;     // exp((logit - max) / T), in (0, 1]
    int32_t id;
  };
  // Strict ranking: higher probability first, lower id on ties.
  static bool ranks_before(const Cand& x, const Cand& y) { return x.p != y.p ? x.p > y.p : x.id < y.id; }
  // Keeps the smallest highest-ranked prefix for which enough(count, mass) holds (at least one
  // token); cand_ stays in id order.
  template <class Enough>
  void keep_top(int64_t vocab, Enough enough);

  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<float> work_;      // penalised logits
  std::vector<int32_t> hist_;    // sorted copy of history for counting
  std::vector<Cand> cand_;       // candidates in ascending id order
  std::vector<Cand> boundary_;   // scratch: the candidates of the boundary bucket
  std::vector<uint8_t> keep_;    // scratch: per-id mark of boundary tokens that stay
};

}  // namespace cm
