#include <cmath>
#include <vector>

#include <algorithm>

#include "ops/attention.h"
#include "ops/linear.h"

namespace cm {

void attention_sink_cpu(const float* q, const float* const* entries, int64_t n, const float* sinks, int64_t heads,
                        int64_t dim, float scale, float* out, float* s) {
  // Scores of every head against every entry: one fixed-order GEMM, s [heads, n].
  if (n > 0) gemm_f32_rows(q, dim, heads, entries, n, dim, s, n);
  for (int64_t h = 0; h < heads; ++h) {
    float* sh = s + h * n;
    float m = sinks[h];
    for (int64_t j = 0; j < n; ++j) m = std::max(m, sh[j] *= scale);
    float den = std::exp(sinks[h] - m);
    for (int64_t j = 0; j < n; ++j) den += (sh[j] = std::exp(sh[j] - m));
    float* oh = out + h * dim;
    for (int64_t d = 0; d < dim; ++d) oh[d] = 0;
    for (int64_t j = 0; j < n; ++j) {
      const float p = sh[j] / den;
      const float* e = entries[j];
      for (int64_t d = 0; d < dim; ++d) oh[d] += p * e[d];
    }
  }
}

void attention_sink_cpu(const float* q, const float* const* entries, int64_t n, const float* sinks, int64_t heads,
                        int64_t dim, float scale, float* out) {
  std::vector<float> s(size_t(heads * (n > 0 ? n : 1)));
  attention_sink_cpu(q, entries, n, sinks, heads, dim, scale, out, s.data());
}

}  // namespace cm
