#include "runtime/row_sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "common/error.h"

namespace cm::runtime {

RowSampler::RowSampler(const SamplingParams& p, const std::vector<int32_t>& prompt)
    : p_(p),
      penalties_(p.repetition_penalty != 1.0f || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) {
  validate_sampling_params(p);
  if (penalties_)
    for (int32_t id : prompt) ++counts_[id];
}

void RowSampler::add(int32_t id) {
  if (penalties_) ++counts_[id];
}

SampleParams RowSampler::params(int64_t pos) const {
  SampleParams s;
  s.temperature = p_.temperature;
  s.top_k = p_.top_k;
  s.top_p = p_.top_p;
  s.min_p = p_.min_p;
  s.repetition_penalty = p_.repetition_penalty;
  s.presence_penalty = p_.presence_penalty;
  s.frequency_penalty = p_.frequency_penalty;
  s.seed = p_.seed;
  s.counter = uint64_t(pos);
  return s;
}

// Distinct ids in ascending order: the bias (summed per id) and the counts of seen ids.
const std::vector<SampleAdjust>& RowSampler::adjustments(int64_t vocab, const int32_t* extra, int64_t n_extra) {
  std::map<int32_t, SampleAdjust> by_id;
  for (const auto& [id, bias] : p_.logit_bias)
    if (id >= 0 && id < vocab) {
      SampleAdjust& a = by_id[id];
      a.id = id;
      a.bias += bias;
    }
  if (penalties_)
    for (const auto& [id, n] : counts_) {
      CM_CHECK(id >= 0 && id < vocab, "sampling: token {} of the history is outside the vocabulary of {}", id, vocab);
      SampleAdjust& a = by_id[id];
      a.id = id;
      a.count = n;
    }
  if (penalties_)
    for (int64_t i = 0; i < n_extra; ++i) {
      const int32_t id = extra[i];
      CM_CHECK(id >= 0 && id < vocab, "sampling: draft token {} is outside the vocabulary of {}", id, vocab);
      SampleAdjust& a = by_id[id];
      a.id = id;
      ++a.count;
    }
  adj_.clear();
  for (const auto& [id, a] : by_id) adj_.push_back(a);
  return adj_;
}

int32_t RowSampler::sample(const float* row, int64_t vocab, int64_t pos, const std::vector<int32_t>& banned) {
  CM_CHECK(row && vocab > 0, "sampling: no logits (vocab {})", vocab);
  row_.assign(row, row + vocab);  // the sampler adjusts its row in place
  for (int32_t id : banned)
    if (id >= 0 && id < vocab) row_[size_t(id)] = -std::numeric_limits<float>::infinity();
  const SampleParams sp = params(pos);
  adjustments(vocab);
  const int64_t off[2] = {0, int64_t(adj_.size())};
  int32_t token = -1, status = 0;
  float logprob = 0;
  SampleArgs a;
  a.logits = row_.data();
  a.rows = 1;
  a.vocab = vocab;
  a.params = &sp;
  if (!adj_.empty()) a.adj = adj_.data(), a.adj_offsets = off;
  a.token = &token;
  a.logprob = &logprob;
  a.status = &status;
  sample_rows_cpu(a);
  CM_CHECK(status != kSampleNonFinite, "sampling: non-finite logits (NaN or +inf)");
  CM_CHECK(status == kSampleOk, "sampling: every token is banned or masked");
  return token;
}

}  // namespace cm::runtime
