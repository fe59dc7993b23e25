// --layer-stats' printing (layer_stats.h).
#include "runtime/layer_stats.h"

namespace cm {

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
