// What both backends share to hand named intermediates to an Observer (seam/observer.h): where
// a scope's statistics read a tensor, and the host path (the CPU backend's for both observer
// kinds; the CUDA backend's for tensor observers, after copying to the host).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "seam/observer.h"

namespace cm {

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

}  // namespace cm
