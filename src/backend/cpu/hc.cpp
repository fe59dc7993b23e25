#include <cmath>
#include <vector>

#include "ops/hc.h"

namespace cm {

static inline float sigmoid(float v) { return 1.0f / (1.0f + std::exp(-v)); }

// mixes[r] = (x · fn[r]) / sqrt(mean(x²) + eps) over the flattened hc·D vector.
static void hc_mixes(const float* fn, int64_t rows, const float* x, int64_t n, float eps, float* mixes) {
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += double(x[i]) * x[i];
  float inv = 1.0f / std::sqrt(float(ss / double(n)) + eps);
  for (int64_t r = 0; r < rows; ++r) {
    const float* w = fn + r * n;
    double acc = 0;
    for (int64_t i = 0; i < n; ++i) acc += double(x[i] * inv) * w[i];
    mixes[r] = float(acc);
  }
}

void hc_sinkhorn(float* c, int64_t hc, int64_t iters, float eps) {
  for (int64_t j = 0; j < hc; ++j) {  // softmax over each row, + eps
    float* row = c + j * hc;
    float m = row[0];
    for (int64_t k = 1; k < hc; ++k) m = std::max(m, row[k]);
    float s = 0;
    for (int64_t k = 0; k < hc; ++k) s += (row[k] = std::exp(row[k] - m));
    for (int64_t k = 0; k < hc; ++k) row[k] = row[k] / s + eps;
  }
  auto col_norm = [&] {
    for (int64_t k = 0; k < hc; ++k) {
      float s = 0;
      for (int64_t j = 0; j < hc; ++j) s += c[j * hc + k];
      for (int64_t j = 0; j < hc; ++j) c[j * hc + k] /= (s + eps);
    }
  };
  auto row_norm = [&] {
    for (int64_t j = 0; j < hc; ++j) {
      float s = 0;
      for (int64_t k = 0; k < hc; ++k) s += c[j * hc + k];
      for (int64_t k = 0; k < hc; ++k) c[j * hc + k] /= (s + eps);
    }
  };
  col_norm();
  for (int64_t it = 0; it + 1 < iters; ++it) {
    row_norm();
    col_norm();
  }
}

void hc_pre_cpu(const HcParams& p, const float* x, int64_t tokens, float* collapsed, float* post, float* comb) {
  const int64_t hc = p.hc, D = p.dim, n = hc * D, rows = (2 + hc) * hc;
#pragma omp parallel for schedule(static) if (tokens * rows * n >= (int64_t(1) << 16))
  for (int64_t t = 0; t < tokens; ++t) {
    std::vector<float> mix(size_t(rows), 0.0f);
    const float* xt = x + t * n;
    hc_mixes(p.fn, rows, xt, n, p.norm_eps, mix.data());
    std::vector<float> pre(static_cast<size_t>(hc));
    for (int64_t k = 0; k < hc; ++k) {
      pre[size_t(k)] = sigmoid(mix[size_t(k)] * p.scale[0] + p.base[k]) + p.hc_eps;
      post[t * hc + k] = 2.0f * sigmoid(mix[size_t(hc + k)] * p.scale[1] + p.base[hc + k]);
    }
    float* c = comb + t * hc * hc;
    for (int64_t i = 0; i < hc * hc; ++i) c[i] = mix[size_t(2 * hc + i)] * p.scale[2] + p.base[2 * hc + i];
    hc_sinkhorn(c, hc, p.sinkhorn_iters, p.hc_eps);
    float* a = collapsed + t * D;
    for (int64_t d = 0; d < D; ++d) {
      float s = 0;
      for (int64_t k = 0; k < hc; ++k) s += pre[size_t(k)] * xt[k * D + d];
      a[d] = s;
    }
  }
}

void hc_post_cpu(int64_t hc, int64_t D, const float* out, const float* post, const float* comb, int64_t tokens,
                 float* x) {
#pragma omp parallel for schedule(static) if (tokens * hc * hc * D >= (int64_t(1) << 16))
  for (int64_t t = 0; t < tokens; ++t) {
    float* xt = x + t * hc * D;
    const float* c = comb + t * hc * hc;
    std::vector<float> old(xt, xt + hc * D);
    for (int64_t k = 0; k < hc; ++k) {
      float pk = post[t * hc + k];
      for (int64_t d = 0; d < D; ++d) {
        float s = pk * out[t * D + d];
        for (int64_t j = 0; j < hc; ++j) s += c[j * hc + k] * old[size_t(j * D + d)];
        xt[k * D + d] = s;
      }
    }
  }
}

void hc_head_cpu(const HcHeadParams& p, const float* x, int64_t tokens, float* y) {
  const int64_t hc = p.hc, D = p.dim, n = hc * D;
#pragma omp parallel for schedule(static) if (tokens * hc * n >= (int64_t(1) << 16))
  for (int64_t t = 0; t < tokens; ++t) {
    std::vector<float> mix(static_cast<size_t>(hc));
    const float* xt = x + t * n;
    hc_mixes(p.fn, hc, xt, n, p.norm_eps, mix.data());
    for (int64_t k = 0; k < hc; ++k) mix[size_t(k)] = sigmoid(mix[size_t(k)] * p.scale[0] + p.base[k]) + p.hc_eps;
    for (int64_t d = 0; d < D; ++d) {
      float s = 0;
      for (int64_t k = 0; k < hc; ++k) s += mix[size_t(k)] * xt[k * D + d];
      y[t * D + d] = s;
    }
  }
}

}  // namespace cm
