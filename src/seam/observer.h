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

}  // namespace cm
