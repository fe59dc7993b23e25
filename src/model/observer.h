// Named intermediates. The forward pass names every intermediate it produces
// ("l12.attn_out", "l12.resid", ...) and hands it to at most one Observer,
// which may print statistics (--layer-stats) or dump tensors by name. This is
// the only debugging hook: nothing in compute code reads the environment.
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace cm {

struct Observer {
  virtual ~Observer() = default;
  // shape: e.g. {T, D}, or {T, hc, D} for the residual streams.
  virtual void observe(const std::string& name, const float* data, const std::vector<int64_t>& shape) = 0;
};

// Prints, for every residual stream after each layer and for the attention
// and MoE outputs: amax, mean, NaN and Inf counts (one line each) to a FILE*.
struct LayerStatsObserver : Observer {
  explicit LayerStatsObserver(std::FILE* out) : out_(out) {}
  void observe(const std::string& name, const float* data, const std::vector<int64_t>& shape) override;

 private:
  std::FILE* out_;
};

struct TensorStats {
  float amax = 0;
  double mean = 0;
  int64_t nan = 0, inf = 0, count = 0;
};
// Statistics over `count` values spaced `stride` apart starting at data.
TensorStats tensor_stats(const float* data, int64_t count, int64_t stride = 1);

}  // namespace cm
