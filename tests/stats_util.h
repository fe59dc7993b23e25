// Observers the stats tests share (CPU suite and GPU suite): a stats observer
// that records every statistic it is given (per stream for [T, K, D] tensors,
// whole otherwise), and a tensor observer that records the full tensors, from
// which the test computes the same statistics with a plain loop.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "common/error.h"
#include "seam/backend.h"
#include "model/model.h"
#include "seam/observer.h"
#include "step_util.h"

namespace cm::test {

struct StatsRecord {
  std::string name;
  std::vector<TensorStats> stats;
};

struct StatsRecorder : Observer {
  std::vector<StatsRecord> seen;
  bool wants_tensors() const override { return false; }
  StatsScope stats_scope(const std::string&, const std::vector<int64_t>& shape) const override {
    return shape.size() == 3 ? StatsScope::PER_STREAM : StatsScope::WHOLE;
  }
  void observe_stats(const std::string& name, const std::vector<TensorStats>& stats) override {
    seen.push_back(StatsRecord{name, stats});
  }
};

// The reference: the same scopes as StatsRecorder, computed from the whole host tensor
// element by element (no shared code with the stats op).
struct TensorStatsReference : Observer {
  std::vector<StatsRecord> seen;
  void observe(const std::string& name, const float* data, const std::vector<int64_t>& shape) override {
    const bool per_stream = shape.size() == 3;
    const int64_t T = shape[0], K = per_stream ? shape[1] : 1;
    int64_t inner = 1;
    for (size_t i = per_stream ? 2 : 1; i < shape.size(); ++i) inner *= shape[i];
    StatsRecord r{name, {}};
    for (int64_t k = 0; k < K; ++k) {
      TensorStats s;
      double sum = 0;
      for (int64_t t = 0; t < T; ++t)
        for (int64_t i = 0; i < inner; ++i) {
          const float v = data[(t * K + k) * inner + i];
          if (std::isnan(v)) ++s.nan;
          else if (std::isinf(v)) ++s.inf;
          else {
            s.amax = std::fmax(s.amax, std::fabs(v));
            sum += v;
            ++s.count;
          }
        }
      s.mean = s.count ? sum / double(s.count) : 0.0;
      r.stats.push_back(s);
    }
    seen.push_back(std::move(r));
  }
};

inline std::vector<std::string> names_of(const std::vector<StatsRecord>& v) {
  std::vector<std::string> n;
  for (const StatsRecord& r : v) n.push_back(r.name);
  return n;
}

inline const StatsRecord* first_non_finite(const std::vector<StatsRecord>& v) {
  for (const StatsRecord& r : v)
    for (const TensorStats& s : r.stats)
      if (s.nan + s.inf > 0) return &r;
  return nullptr;
}

// hf_text with a NaN in layer 1's attention norm weight, 3 tokens into slot 1 on device d: the
// statistics a StatsRecorder received; `threw` tells whether the step threw (it should).
inline std::vector<StatsRecord> nan_weight_stats(const std::string& data_dir, Device d, bool& threw) {
  auto m = model_load(data_dir + "/golden/hf_text");
  m->weights.layers[1].attn_norm[3] = std::nanf("");
  StatsRecorder stats;
  BackendOptions opt;
  opt.observer = &stats;
  auto be = reserved_backend(*m, d, 2, 8, 16, opt);
  std::vector<int32_t> toks = {5, 9, 3};
  threw = false;
  try {
    feed_chunks(*be, 1, toks.data(), 3, 0, m->config.vocab_size);
  } catch (const Error&) {
    threw = true;
  }
  return stats.seen;
}

// The NaN-weight run on device d: the step throws, and the statistics that arrived before it name layer
// 1's attention input of slot 1 first, with one NaN per row, and end with the logits.
inline void expect_nan_weight_stats(const std::string& data_dir, Device d) {
  bool threw = false;
  const std::vector<StatsRecord> seen = nan_weight_stats(data_dir, d, threw);
  EXPECT_TRUE(threw);
  const StatsRecord* first_bad = first_non_finite(seen);
  ASSERT_NE(first_bad, nullptr);
  EXPECT_EQ(first_bad->name, "l1.s1.attn_in");
  EXPECT_EQ(first_bad->stats[0].nan, 3);
  ASSERT_FALSE(seen.empty());
  EXPECT_EQ(seen.back().name, "logits");
}

}  // namespace cm::test
