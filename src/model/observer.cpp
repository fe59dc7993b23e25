// The observer's shared parts: where a scope's statistics read a tensor, the
// host path every backend can use, and --layer-stats' printing (observer.h).
#include "model/observer.h"

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

namespace {

bool ends_with(const std::string& name, const char* suffix) {
  const std::string s(suffix);
  return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
}

void print_stats(std::FILE* out, const std::string& label, const TensorStats& s) {
  std::fprintf(out, "%-24s amax %-12.5g mean %-12.5g nan %lld inf %lld%s\n", label.c_str(), double(s.amax), s.mean,
               (long long)s.nan, (long long)s.inf, (s.nan || s.inf) ? "   <-- non-finite" : "");
}

}  // namespace

StatsScope LayerStatsObserver::stats_scope(const std::string& name, const std::vector<int64_t>& shape) const {
  if (ends_with(name, ".resid") && shape.size() == 3) return StatsScope::PER_STREAM;
  if (ends_with(name, ".attn_out") || ends_with(name, ".moe_out") || name == "logits") return StatsScope::WHOLE;
  return StatsScope::NONE;
}

void LayerStatsObserver::observe_stats(const std::string& name, const std::vector<TensorStats>& stats) {
  if (stats.size() == 1 && !ends_with(name, ".resid")) {
    print_stats(out_, name, stats[0]);
    return;
  }
  for (size_t k = 0; k < stats.size(); ++k) print_stats(out_, name + "[" + std::to_string(k) + "]", stats[k]);
}

}  // namespace cm
