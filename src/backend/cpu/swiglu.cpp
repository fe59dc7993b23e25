#include <algorithm>
#include <cmath>

#include "ops/swiglu.h"

namespace cm {

void swiglu_cpu(const float* g, const float* u, int64_t n, float limit, float* h) {
  for (int64_t j = 0; j < n; ++j) {
    float gv = g[j], uv = u[j];
    if (limit > 0) {
      gv = std::min(gv, limit);
      uv = std::min(std::max(uv, -limit), limit);
    }
    h[j] = gv / (1.0f + std::exp(-gv)) * uv;
  }
}

}  // namespace cm
