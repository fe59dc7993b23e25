// Named intermediates. The forward pass names every intermediate it produces
// ("l12.s0.attn_out", "l12.s0.resid", ...) and hands it to at most one
// Observer. This is the only debugging hook: nothing in compute code reads the
// environment.
//
// An observer is one of two kinds, fixed for its life:
//  - a tensor observer (dumps, tests) gets every intermediate whole, on the
//    host: observe(). The CUDA backend copies each one back to do so.
//  - a stats observer (--layer-stats; wants_tensors() false) is never handed a
//    tensor. For each name, stats_scope() says which statistics it wants; the
//    backend computes them where the tensor lives (the CPU backend with the CPU
//    stats op, the CUDA backend on the device, reading back only the results
//    after the step) and calls observe_stats() in the order the intermediates
//    were produced. Both backends give the same names; the values agree within
//    the GPU's bf16 activations.
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "ops/stats.h"

namespace cm {

// Which statistics a stats observer wants of one named intermediate.
enum class StatsScope : uint8_t {
  NONE,        // nothing
  WHOLE,       // one TensorStats over the whole tensor
  PER_STREAM,  // a [T, K, D] tensor: one TensorStats per k over its T·D values (the residual's hc
               // streams); a tensor of fewer than 3 dimensions: as WHOLE
};

struct Observer {
  virtual ~Observer() = default;
  virtual bool wants_tensors() const { return true; }
  // Tensor observers. shape: e.g. {T, D}, or {T, hc, D} for the residual streams.
  virtual void observe(const std::string& name, const float* data, const std::vector<int64_t>& shape) {}
  // Stats observers.
  virtual StatsScope stats_scope(const std::string& name, const std::vector<int64_t>& shape) const {
    return StatsScope::NONE;
  }
  // stats: one entry (WHOLE) or one per stream k (PER_STREAM).
  virtual void observe_stats(const std::string& name, const std::vector<TensorStats>& stats) {}
};

// Where the statistics of `scope` read a tensor of `shape`: `streams` results, result k over
// `rows` segments of `len` values `stride` apart starting at element k·offset (ops/stats.h).
struct StatsLayout {
  int64_t streams = 1, rows = 0, len = 1, stride = 1, offset = 0;
};
StatsLayout stats_layout(const std::vector<int64_t>& shape, StatsScope scope);

// The statistics `scope` asks of a host tensor, with the CPU stats op.
std::vector<TensorStats> host_stats(const float* data, const std::vector<int64_t>& shape, StatsScope scope);

// Hands one host tensor to an observer: whole to a tensor observer, as the statistics it asks
// for to a stats observer (the CPU backend's path for both kinds).
void observe_host(Observer& o, const std::string& name, const float* data, const std::vector<int64_t>& shape);

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
