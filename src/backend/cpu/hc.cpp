#include <cmath>
#include <vector>

#include "common/error.h"
#include "ops/hc.h"
#include "ops/linear.h"

namespace cm {

static inline float sigmoid(float v) { return 1.0f / (1.0f + std::exp(-v)); }

// The largest hc the fixed per-token arrays below hold (configs are checked against it at load).
constexpr int64_t kMaxHc = 16;

// mixes[t, r] = (x_t / sqrt(mean(x_t²) + eps)) · fn[r] over the flattened hc·D
// vector of each token: scaled copies go to xs [T, n], then one fixed-order GEMM.
static void hc_mixes(const float* fn, int64_t rows, const float* x, int64_t tokens, int64_t n, float eps, float* xs,
                     float* mixes) {
#pragma omp parallel for schedule(static) if (tokens * n >= (int64_t(1) << 16))
  for (int64_t t = 0; t < tokens; ++t) {
    const float* xt = x + t * n;
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += double(xt[i]) * xt[i];
    const float inv = 1.0f / std::sqrt(float(ss / double(n)) + eps);
    for (int64_t i = 0; i < n; ++i) xs[t * n + i] = xt[i] * inv;
  }
  gemm_f32(xs, tokens, fn, rows, n, mixes);
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

size_t hc_pre_scratch_floats(int64_t hc, int64_t dim, int64_t tokens) {
  return size_t(tokens * (hc * dim + (2 + hc) * hc));
}

void hc_pre_cpu(const HcParams& p, const float* x, int64_t tokens, float* collapsed, float* post, float* comb,
                float* scratch) {
  const int64_t hc = p.hc, D = p.dim, n = hc * D, rows = (2 + hc) * hc;
  CM_CHECK(hc >= 1 && hc <= kMaxHc, "hc_pre: hc_mult {} outside [1, {}]", hc, kMaxHc);
  float* mixes = scratch + tokens * n;
  hc_mixes(p.fn, rows, x, tokens, n, p.norm_eps, scratch, mixes);
#pragma omp parallel for schedule(static) if (tokens * n >= (int64_t(1) << 15))
  for (int64_t t = 0; t < tokens; ++t) {
    const float* mix = mixes + t * rows;
    const float* xt = x + t * n;
    float pre[kMaxHc];
    for (int64_t k = 0; k < hc; ++k) {
      pre[k] = sigmoid(mix[k] * p.scale[0] + p.base[k]) + p.hc_eps;
      post[t * hc + k] = 2.0f * sigmoid(mix[hc + k] * p.scale[1] + p.base[hc + k]);
    }
    float* c = comb + t * hc * hc;
    for (int64_t i = 0; i < hc * hc; ++i) c[i] = mix[2 * hc + i] * p.scale[2] + p.base[2 * hc + i];
    hc_sinkhorn(c, hc, p.sinkhorn_iters, p.hc_eps);
    float* a = collapsed + t * D;
    for (int64_t d = 0; d < D; ++d) {
      float s = 0;
      for (int64_t k = 0; k < hc; ++k) s += pre[k] * xt[k * D + d];
      a[d] = s;
    }
  }
}

void hc_pre_cpu(const HcParams& p, const float* x, int64_t tokens, float* collapsed, float* post, float* comb) {
  std::vector<float> scratch(hc_pre_scratch_floats(p.hc, p.dim, tokens));
  hc_pre_cpu(p, x, tokens, collapsed, post, comb, scratch.data());
}

// X'_k[d] = post_k·out[d] + Σ_j comb[j][k]·X_j[d], in place: the hc old values
// of one channel d are read before any is written.
void hc_post_cpu(int64_t hc, int64_t D, const float* out, const float* post, const float* comb, int64_t tokens,
                 float* x) {
  CM_CHECK(hc >= 1 && hc <= kMaxHc, "hc_post: hc_mult {} outside [1, {}]", hc, kMaxHc);
#pragma omp parallel for schedule(static) if (tokens * hc * hc * D >= (int64_t(1) << 16))
  for (int64_t t = 0; t < tokens; ++t) {
    float* xt = x + t * hc * D;
    const float* c = comb + t * hc * hc;
    const float* pt = post + t * hc;
    float old[kMaxHc];
    for (int64_t d = 0; d < D; ++d) {
      for (int64_t j = 0; j < hc; ++j) old[j] = xt[j * D + d];
      for (int64_t k = 0; k < hc; ++k) {
        float s = pt[k] * out[t * D + d];
        for (int64_t j = 0; j < hc; ++j) s += c[j * hc + k] * old[j];
        xt[k * D + d] = s;
      }
    }
  }
}

size_t hc_head_scratch_floats(int64_t hc, int64_t dim, int64_t tokens) { return size_t(tokens * (hc * dim + hc)); }

void hc_head_cpu(const HcHeadParams& p, const float* x, int64_t tokens, float* y, float* scratch) {
  const int64_t hc = p.hc, D = p.dim, n = hc * D;
  CM_CHECK(hc >= 1 && hc <= kMaxHc, "hc_head: hc_mult {} outside [1, {}]", hc, kMaxHc);
  float* mixes = scratch + tokens * n;
  hc_mixes(p.fn, hc, x, tokens, n, p.norm_eps, scratch, mixes);
  for (int64_t t = 0; t < tokens; ++t) {
    const float* xt = x + t * n;
    float mix[kMaxHc];
    for (int64_t k = 0; k < hc; ++k) mix[k] = sigmoid(mixes[t * hc + k] * p.scale[0] + p.base[k]) + p.hc_eps;
    for (int64_t d = 0; d < D; ++d) {
      float s = 0;
      for (int64_t k = 0; k < hc; ++k) s += mix[k] * xt[k * D + d];
      y[t * D + d] = s;
    }
  }
}

void hc_head_cpu(const HcHeadParams& p, const float* x, int64_t tokens, float* y) {
  std::vector<float> scratch(hc_head_scratch_floats(p.hc, p.dim, tokens));
  hc_head_cpu(p, x, tokens, y, scratch.data());
}

}  // namespace cm
