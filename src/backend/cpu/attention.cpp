#include <cmath>
#include <vector>

#include "ops/attention.h"

namespace cm {

void attention_sink_cpu(const float* q, const float* const* entries, int64_t n, const float* sinks, int64_t heads,
                        int64_t dim, float scale, float* out) {
  std::vector<float> s(size_t(n > 0 ? n : 1));
  for (int64_t h = 0; h < heads; ++h) {
    const float* qh = q + h * dim;
    float m = sinks[h];
    for (int64_t j = 0; j < n; ++j) {
      const float* e = entries[j];
      float acc = 0;
      for (int64_t d = 0; d < dim; ++d) acc += qh[d] * e[d];
      s[size_t(j)] = acc * scale;
      m = std::max(m, s[size_t(j)]);
    }
    float den = std::exp(sinks[h] - m);
    for (int64_t j = 0; j < n; ++j) den += (s[size_t(j)] = std::exp(s[size_t(j)] - m));
    float* oh = out + h * dim;
    for (int64_t d = 0; d < dim; ++d) oh[d] = 0;
    for (int64_t j = 0; j < n; ++j) {
      const float p = s[size_t(j)] / den;
      const float* e = entries[j];
      for (int64_t d = 0; d < dim; ++d) oh[d] += p * e[d];
    }
  }
}

}  // namespace cm
