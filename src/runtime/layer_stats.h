// --layer-stats' observer: prints the statistics of a step's named intermediates (seam/observer.h).
#pragma once
#include <cstdio>
#include <string>
#include <vector>

#include "seam/observer.h"

namespace cm {

// --layer-stats: prints, for every residual stream after each layer and for the attention and MoE
// outputs and the logits: amax, mean, NaN and Inf counts (one line each) to a FILE*.
struct LayerStatsObserver : Observer {
  explicit LayerStatsObserver(std::FILE* out) : out_(out) {}
  bool wants_tensors() const override { return false; }
  StatsScope stats_scope(const std::string& name, const std::vector<int64_t>& shape) const override;
  void observe_stats(const std::string& name, const std::vector<TensorStats>& stats) override;

 private:
  std::FILE* out_;
};

}  // namespace cm
