#include "model/observer.h"

#include <cmath>

namespace cm {

TensorStats tensor_stats(const float* data, int64_t count, int64_t stride) {
  TensorStats s;
  double sum = 0;
  for (int64_t i = 0; i < count; ++i) {
    float v = data[i * stride];
    if (std::isnan(v)) {
      ++s.nan;
      continue;
    }
    if (std::isinf(v)) {
      ++s.inf;
      continue;
    }
    s.amax = std::max(s.amax, std::fabs(v));
    sum += v;
    ++s.count;
  }
  s.mean = s.count ? sum / double(s.count) : 0.0;
  return s;
}

static void print_stats(std::FILE* out, const std::string& label, const TensorStats& s) {
  std::fprintf(out, "%-24s amax %-12.5g mean %-12.5g nan %lld inf %lld%s\n", label.c_str(), double(s.amax), s.mean,
               (long long)s.nan, (long long)s.inf, (s.nan || s.inf) ? "   <-- non-finite" : "");
}

void LayerStatsObserver::observe(const std::string& name, const float* data, const std::vector<int64_t>& shape) {
  auto ends_with = [&](const char* suf) {
    std::string s(suf);
    return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
  };
  if (ends_with(".resid") && shape.size() == 3) {
    // Per stream k: values X[t, k, :] over all tokens t.
    const int64_t T = shape[0], hc = shape[1], D = shape[2];
    for (int64_t k = 0; k < hc; ++k) {
      TensorStats acc;
      double sum = 0;
      for (int64_t t = 0; t < T; ++t) {
        TensorStats s = tensor_stats(data + (t * hc + k) * D, D);
        acc.amax = std::max(acc.amax, s.amax);
        sum += s.mean * double(s.count);
        acc.count += s.count;
        acc.nan += s.nan;
        acc.inf += s.inf;
      }
      acc.mean = acc.count ? sum / double(acc.count) : 0.0;
      print_stats(out_, name + "[" + std::to_string(k) + "]", acc);
    }
  } else if (ends_with(".attn_out") || ends_with(".moe_out") || name == "logits") {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    print_stats(out_, name, tensor_stats(data, n));
  }
}

}  // namespace cm
