// Where a scope's statistics read a tensor, and the host path of an observed tensor (observe.h).
#include "backend/observe.h"

#include <algorithm>

namespace cm {

StatsLayout stats_layout(const std::vector<int64_t>& shape, StatsScope scope) {
  StatsLayout l;
  if (scope == StatsScope::PER_STREAM && shape.size() >= 3) {
    int64_t inner = 1;
    for (size_t i = 2; i < shape.size(); ++i) inner *= shape[i];
    l.streams = shape[1];
    l.rows = shape[0];
    l.len = inner;
    l.stride = shape[1] * inner;
    l.offset = inner;
  } else {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    l.rows = n > 0 ? 1 : 0;
    l.len = l.stride = std::max<int64_t>(n, 1);
  }
  if (l.len == 0) l.rows = 0, l.len = 1;  // an empty stream: no values
  return l;
}

std::vector<TensorStats> host_stats(const float* data, const std::vector<int64_t>& shape, StatsScope scope) {
  const StatsLayout l = stats_layout(shape, scope);
  std::vector<TensorStats> out;
  out.reserve(size_t(l.streams));
  for (int64_t k = 0; k < l.streams; ++k) out.push_back(tensor_stats_cpu(data + k * l.offset, l.rows, l.len, l.stride));
  return out;
}

void observe_host(Observer& o, const std::string& name, const float* data, const std::vector<int64_t>& shape) {
  if (o.wants_tensors()) {
    o.observe(name, data, shape);
    return;
  }
  const StatsScope scope = o.stats_scope(name, shape);
  if (scope != StatsScope::NONE) o.observe_stats(name, host_stats(data, shape, scope));
}

}  // namespace cm
