// Tensor statistics on the CPU (see ops/stats.h): one pass in order, the sum
// in double, so the mean of a [T, hc, D] stream does not depend on T's split.
#include <algorithm>
#include <cmath>

#include "ops/stats.h"

namespace cm {

TensorStats tensor_stats_cpu(const float* x, int64_t rows, int64_t len, int64_t stride) {
  TensorStats s;
  double sum = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x + r * stride;
    for (int64_t i = 0; i < len; ++i) {
      const float v = row[i];
      if (std::isnan(v)) {
        ++s.nan;
      } else if (std::isinf(v)) {
        ++s.inf;
      } else {
        s.amax = std::max(s.amax, std::fabs(v));
        sum += double(v);
        ++s.count;
      }
    }
  }
  s.mean = s.count ? sum / double(s.count) : 0.0;
  return s;
}

}  // namespace cm
