// The engine's draw of one token: a job's SamplingParams over one row of logits through the row
// sampler every backend shares (ops/sample.h: integer weights, radix-selected thresholds, a Philox
// draw keyed by the job's seed and counted by the token's position). The draw depends on the row,
// the parameters and the position only, so a sequence samples the same tokens alone or in any batch,
// and the same as a backend that samples on its device (ModelBackend::sample_last_step).
#pragma once
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "ops/sample.h"
#include "sampling/sampler.h"

namespace cm::runtime {

// Per sequence: the occurrence counts the penalties need, kept as tokens arrive, and scratch.
class RowSampler {
 public:
  RowSampler(const SamplingParams& p, const std::vector<int32_t>& prompt);
  // The token for `row` [vocab] at position `pos` (the sequence's length so far); `banned` ids and
  // -inf logits are never drawn. cm::Error on non-finite logits or when nothing may be drawn.
  int32_t sample(const float* row, int64_t vocab, int64_t pos, const std::vector<int32_t>& banned);
  // A token joined the sequence (counts for the penalties).
  void add(int32_t id);
  // The ops/sample.h form of the parameters and adjustments (for a device step: sample_last_step).
  SampleParams params(int64_t pos) const;
  const std::vector<SampleAdjust>& adjustments(int64_t vocab) { return adjustments(vocab, nullptr, 0); }
  // The adjustments as if the `n_extra` tokens `extra` had joined the sequence too (an MTP verify row
  // after drafts), leaving the counts as they are.
  const std::vector<SampleAdjust>& adjustments(int64_t vocab, const int32_t* extra, int64_t n_extra);

 private:
  SamplingParams p_;
  bool penalties_;
  std::unordered_map<int32_t, int32_t> counts_;
  std::vector<SampleAdjust> adj_;
  std::vector<float> row_;
};

}  // namespace cm::runtime
