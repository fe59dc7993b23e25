#include <algorithm>
#include <cmath>
#include <numeric>

#include "ops/compressor.h"

namespace cm {

void compress_pool_cpu(const float* kv, const float* gate, int64_t slots, int64_t dim, float* out) {
  for (int64_t c = 0; c < dim; ++c) {
    float m = -INFINITY;
    for (int64_t s = 0; s < slots; ++s) m = std::max(m, gate[s * dim + c]);
    float den = 0, acc = 0;
    for (int64_t s = 0; s < slots; ++s) {
      float g = gate[s * dim + c];
      if (g == -INFINITY) continue;
      float e = std::exp(g - m);
      den += e;
      acc += e * kv[s * dim + c];
    }
    out[c] = acc / den;
  }
}

void indexer_scores_cpu(const float* q, const float* keys, int64_t n, const float* w, int64_t heads, int64_t dim,
                        float* score) {
  const float qscale = 1.0f / std::sqrt(float(dim));
  for (int64_t i = 0; i < n; ++i) {
    const float* k = keys + i * dim;
    float s = 0;
    for (int64_t h = 0; h < heads; ++h) {
      const float* qh = q + h * dim;
      float d = 0;
      for (int64_t j = 0; j < dim; ++j) d += qh[j] * k[j];
      s += std::max(d, 0.0f) * qscale * w[h];
    }
    score[i] = s;
  }
}

std::vector<int32_t> topk_lower_index_first(const float* scores, int64_t n, int64_t k) {
  k = std::min(k, n);
  std::vector<int32_t> idx(static_cast<size_t>(n));
  std::iota(idx.begin(), idx.end(), 0);
  auto better = [&](int32_t a, int32_t b) {
    return scores[a] > scores[b] || (scores[a] == scores[b] && a < b);
  };
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), better);
  idx.resize(size_t(k));
  return idx;
}

}  // namespace cm
