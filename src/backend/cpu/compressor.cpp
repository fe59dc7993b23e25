#include <algorithm>
#include <cmath>
#include <numeric>

#include <vector>

#include "ops/compressor.h"
#include "ops/linear.h"

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
                        float* score, float* scratch, const float** key_rows) {
  const float qscale = 1.0f / std::sqrt(float(dim));
  // d[h, i] = q_h · key_i in blocks of kChunk keys (scratch: heads·kChunk floats, key_rows: kChunk pointers).
  for (int64_t i0 = 0; i0 < n; i0 += kIndexerChunk) {
    const int64_t nb = std::min(kIndexerChunk, n - i0);
    for (int64_t i = 0; i < nb; ++i) key_rows[i] = keys + (i0 + i) * dim;
    gemm_f32_rows(q, dim, heads, key_rows, nb, dim, scratch, nb);
    for (int64_t i = 0; i < nb; ++i) {
      float s = 0;
      for (int64_t h = 0; h < heads; ++h) s += std::max(scratch[h * nb + i], 0.0f) * qscale * w[h];
      score[i0 + i] = s;
    }
  }
}

void indexer_scores_cpu(const float* q, const float* keys, int64_t n, const float* w, int64_t heads, int64_t dim,
                        float* score) {
  std::vector<float> scratch(static_cast<size_t>(heads * kIndexerChunk));
  std::vector<const float*> rows(static_cast<size_t>(kIndexerChunk));
  indexer_scores_cpu(q, keys, n, w, heads, dim, score, scratch.data(), rows.data());
}

int64_t topk_lower_index_first(const float* scores, int64_t n, int64_t k, int32_t* idx, int32_t* out) {
  k = std::min(k, n);
  for (int64_t i = 0; i < n; ++i) idx[i] = int32_t(i);
  auto better = [&](int32_t a, int32_t b) {
    return scores[a] > scores[b] || (scores[a] == scores[b] && a < b);
  };
  std::partial_sort(idx, idx + k, idx + n, better);
  std::copy(idx, idx + k, out);
  return k;
}

std::vector<int32_t> topk_lower_index_first(const float* scores, int64_t n, int64_t k) {
  std::vector<int32_t> idx(static_cast<size_t>(n)), out(static_cast<size_t>(std::min(k, n)));
  topk_lower_index_first(scores, n, k, idx.data(), out.data());
  return out;
}

}  // namespace cm
