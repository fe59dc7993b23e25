// Per-op tests of the CPU kernels against small naive references written here
// (double precision, straight from the spec's formulas).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "model/config.h"
#include "ops/attention.h"
#include "ops/compressor.h"
#include "ops/hc.h"
#include "ops/linear.h"
#include "ops/norm.h"
#include "ops/rope.h"

using namespace cm;

namespace {
std::vector<float> randn(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}
}  // namespace

TEST(RmsNorm, SpecAnchorAndWeighted) {
  float x[3] = {1, 2, 3}, y[3];
  rms_norm_cpu(x, nullptr, 1, 3, 1e-6f, y);
  EXPECT_NEAR(y[0], 0.46291, 1e-5);
  EXPECT_NEAR(y[1], 0.92582, 1e-5);
  EXPECT_NEAR(y[2], 1.38873, 1e-5);
  auto v = randn(5 * 64, 1), w = randn(64, 2);
  std::vector<float> out(v.size());
  rms_norm_cpu(v.data(), w.data(), 5, 64, 1e-6f, out.data());
  for (int r = 0; r < 5; ++r) {
    double ss = 0;
    for (int i = 0; i < 64; ++i) ss += double(v[r * 64 + i]) * v[r * 64 + i];
    double inv = 1.0 / std::sqrt(ss / 64 + 1e-6);
    for (int i = 0; i < 64; ++i) EXPECT_NEAR(out[r * 64 + i], w[i] * v[r * 64 + i] * inv, 1e-5);
  }
}

TEST(Rope, YarnFrequenciesMatchSpec) {
  RopeConfig r;
  r.theta = 160000;
  r.yarn = true;
  r.factor = 16;
  r.original_max_position = 65536;
  r.beta_fast = 32;
  r.beta_slow = 1;
  auto f = rope_frequencies(r, 64);
  ASSERT_EQ(f.size(), 32u);
  EXPECT_NEAR(f[0], 1.0, 1e-6);
  EXPECT_NEAR(f[1], 0.687656, 1e-6);
  EXPECT_NEAR(f[2], 0.472871, 1e-6);
  EXPECT_NEAR(f[31] / 5.680529e-07, 1.0, 1e-5);
  // lo = 15, hi = 25: dims up to 15 untouched, from 25 on divided by 16.
  for (int i = 0; i < 32; ++i) {
    double plain = std::pow(160000.0, -2.0 * i / 64);
    if (i <= 15) EXPECT_NEAR(f[i] / plain, 1.0, 1e-5) << i;
    if (i >= 25) EXPECT_NEAR(f[i] / (plain / 16), 1.0, 1e-5) << i;
    if (i > 15 && i < 25) {
      EXPECT_LT(f[i], plain * (1 - 1e-4)) << i;
      EXPECT_GT(f[i], plain / 16 * (1 + 1e-4)) << i;
    }
  }
  RopeConfig plain;
  plain.theta = 10000;
  auto g = rope_frequencies(plain, 64);
  for (int i = 0; i < 32; ++i) EXPECT_NEAR(g[i] / std::pow(10000.0, -2.0 * i / 64), 1.0, 1e-5);
}

TEST(Rope, RotatesTrailingPairsAndInverts) {
  RopeTable t{rope_frequencies(RopeConfig{}, 8), 1.0f, 8};
  auto v = randn(3 * 32, 7);
  auto w = v;
  const int64_t pos = 37;
  rope_apply_cpu(w.data(), 3, 32, pos, t, false);
  for (int r = 0; r < 3; ++r) {
    for (int i = 0; i < 24; ++i) EXPECT_EQ(w[r * 32 + i], v[r * 32 + i]);  // nope dims untouched
    for (int i = 0; i < 4; ++i) {
      double ang = double(t.freqs[i]) * pos, a = v[r * 32 + 24 + 2 * i], b = v[r * 32 + 25 + 2 * i];
      EXPECT_NEAR(w[r * 32 + 24 + 2 * i], a * std::cos(ang) - b * std::sin(ang), 1e-4);
      EXPECT_NEAR(w[r * 32 + 25 + 2 * i], a * std::sin(ang) + b * std::cos(ang), 1e-4);
    }
  }
  rope_apply_cpu(w.data(), 3, 32, pos, t, true);
  for (size_t i = 0; i < v.size(); ++i) EXPECT_NEAR(w[i], v[i], 1e-5);
}

TEST(Sinkhorn, DoublyStochasticAndMatchesNaive) {
  const int hc = 4;
  auto c = randn(hc * hc, 11, 2.0f);
  std::vector<double> ref(c.begin(), c.end());
  hc_sinkhorn(c.data(), hc, 20, 1e-6f);
  // naive: softmax rows + eps, col norm, then 19 × (row, col)
  for (int j = 0; j < hc; ++j) {
    double m = -1e30, s = 0;
    for (int k = 0; k < hc; ++k) m = std::max(m, ref[j * hc + k]);
    for (int k = 0; k < hc; ++k) s += std::exp(ref[j * hc + k] - m);
    for (int k = 0; k < hc; ++k) ref[j * hc + k] = std::exp(ref[j * hc + k] - m) / s + 1e-6;
  }
  auto col = [&] {
    for (int k = 0; k < hc; ++k) {
      double s = 0;
      for (int j = 0; j < hc; ++j) s += ref[j * hc + k];
      for (int j = 0; j < hc; ++j) ref[j * hc + k] /= s + 1e-6;
    }
  };
  auto row = [&] {
    for (int j = 0; j < hc; ++j) {
      double s = 0;
      for (int k = 0; k < hc; ++k) s += ref[j * hc + k];
      for (int k = 0; k < hc; ++k) ref[j * hc + k] /= s + 1e-6;
    }
  };
  col();
  for (int i = 0; i < 19; ++i) row(), col();
  for (int i = 0; i < hc * hc; ++i) EXPECT_NEAR(c[i], ref[i], 1e-5);
  for (int j = 0; j < hc; ++j) {
    double rs = 0, cs = 0;
    for (int k = 0; k < hc; ++k) rs += c[j * hc + k], cs += c[k * hc + j];
    EXPECT_NEAR(rs, 1.0, 1e-3);
    EXPECT_NEAR(cs, 1.0, 1e-3);
  }
}

TEST(HyperConnections, PrePostHeadMatchNaive) {
  const int64_t hc = 4, D = 16, T = 3, rows = (2 + hc) * hc;
  auto x = randn(T * hc * D, 3), fn = randn(rows * hc * D, 4, 0.1f), base = randn(rows, 5), scale = randn(3, 6);
  HcParams p{fn.data(), base.data(), scale.data(), hc, D, 20, 1e-6f, 1e-6f};
  std::vector<float> a(T * D), post(T * hc), comb(T * hc * hc);
  hc_pre_cpu(p, x.data(), T, a.data(), post.data(), comb.data());
  auto sig = [](double v) { return 1 / (1 + std::exp(-v)); };
  for (int64_t t = 0; t < T; ++t) {
    const float* xt = &x[t * hc * D];
    double ss = 0;
    for (int64_t i = 0; i < hc * D; ++i) ss += double(xt[i]) * xt[i];
    double inv = 1 / std::sqrt(ss / double(hc * D) + 1e-6);
    std::vector<double> mix(rows);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < hc * D; ++i) mix[r] += xt[i] * inv * fn[r * hc * D + i];
    std::vector<float> cm(hc * hc);
    for (int64_t i = 0; i < hc * hc; ++i) cm[i] = float(mix[2 * hc + i] * scale[2] + base[2 * hc + i]);
    hc_sinkhorn(cm.data(), hc, 20, 1e-6f);
    for (int64_t k = 0; k < hc; ++k) {
      EXPECT_NEAR(post[t * hc + k], 2 * sig(mix[hc + k] * scale[1] + base[hc + k]), 1e-5);
    }
    for (int64_t i = 0; i < hc * hc; ++i) EXPECT_NEAR(comb[t * hc * hc + i], cm[i], 1e-5);
    for (int64_t d = 0; d < D; ++d) {
      double s = 0;
      for (int64_t k = 0; k < hc; ++k) s += (sig(mix[k] * scale[0] + base[k]) + 1e-6) * xt[k * D + d];
      EXPECT_NEAR(a[t * D + d], s, 1e-4);
    }
  }
  // post: X'_k = post_k·out + Σ_j comb[j][k] X_j (transpose)
  auto out = randn(T * D, 8);
  auto x2 = x;
  hc_post_cpu(hc, D, out.data(), post.data(), comb.data(), T, x2.data());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k = 0; k < hc; ++k)
      for (int64_t d = 0; d < D; ++d) {
        double s = post[t * hc + k] * out[t * D + d];
        for (int64_t j = 0; j < hc; ++j) s += comb[t * hc * hc + j * hc + k] * x[(t * hc + j) * D + d];
        EXPECT_NEAR(x2[(t * hc + k) * D + d], s, 1e-4);
      }
  // head
  auto hfn = randn(hc * hc * D, 9, 0.1f), hb = randn(hc, 10), hs = randn(1, 12);
  HcHeadParams hp{hfn.data(), hb.data(), hs.data(), hc, D, 1e-6f, 1e-6f};
  std::vector<float> y(T * D);
  hc_head_cpu(hp, x.data(), T, y.data());
  for (int64_t t = 0; t < T; ++t) {
    const float* xt = &x[t * hc * D];
    double ss = 0;
    for (int64_t i = 0; i < hc * D; ++i) ss += double(xt[i]) * xt[i];
    double inv = 1 / std::sqrt(ss / double(hc * D) + 1e-6);
    for (int64_t d = 0; d < D; ++d) {
      double s = 0;
      for (int64_t k = 0; k < hc; ++k) {
        double mk = 0;
        for (int64_t i = 0; i < hc * D; ++i) mk += xt[i] * inv * hfn[k * hc * D + i];
        s += (sig(mk * hs[0] + hb[k]) + 1e-6) * xt[k * D + d];
      }
      EXPECT_NEAR(y[t * D + d], s, 1e-4);
    }
  }
}

TEST(Compressor, SoftmaxPoolingPerChannel) {
  const int64_t slots = 8, dim = 5;
  auto kv = randn(slots * dim, 21), gate = randn(slots * dim, 22, 2.0f);
  for (int64_t c = 0; c < dim; ++c) gate[0 * dim + c] = gate[1 * dim + c] = -INFINITY;  // missing slots
  std::vector<float> out(dim);
  compress_pool_cpu(kv.data(), gate.data(), slots, dim, out.data());
  for (int64_t c = 0; c < dim; ++c) {
    double den = 0, acc = 0;
    for (int64_t s = 2; s < slots; ++s) {
      den += std::exp(double(gate[s * dim + c]));
      acc += std::exp(double(gate[s * dim + c])) * kv[s * dim + c];
    }
    EXPECT_NEAR(out[c], acc / den, 1e-5);
  }
}

TEST(Indexer, TopkTiesTakeLowerIndexFirst) {
  float s[8] = {0.0f, 2.0f, 0.0f, 2.0f, 1.0f, 0.0f, 3.0f, 0.0f};
  auto k = topk_lower_index_first(s, 8, 5);
  EXPECT_EQ(k, (std::vector<int32_t>{6, 1, 3, 4, 0}));
  EXPECT_EQ(topk_lower_index_first(s, 3, 10), (std::vector<int32_t>{1, 0, 2}));
  EXPECT_TRUE(topk_lower_index_first(s, 0, 4).empty());
}

TEST(Indexer, ScoresMatchNaive) {
  const int64_t heads = 16, dim = 32, n = 9;
  auto q = randn(heads * dim, 51), keys = randn(n * dim, 52), w = randn(heads, 53);
  std::vector<float> s(n);
  indexer_scores_cpu(q.data(), keys.data(), n, w.data(), heads, dim, s.data());
  for (int64_t i = 0; i < n; ++i) {
    double ref = 0;
    for (int64_t h = 0; h < heads; ++h) {
      double d = 0;
      for (int64_t j = 0; j < dim; ++j) d += double(q[h * dim + j]) * keys[i * dim + j];
      ref += std::max(d, 0.0) / std::sqrt(double(dim)) * w[h];
    }
    EXPECT_NEAR(s[i], ref, 1e-4) << i;
  }
  // A key orthogonal to every query gets exactly 0 (ReLU), which is where ties come from.
  std::vector<float> zero(dim, 0.0f), z(1);
  indexer_scores_cpu(q.data(), zero.data(), 1, w.data(), heads, dim, z.data());
  EXPECT_EQ(z[0], 0.0f);
}

TEST(Attention, SinkSoftmaxMatchesNaive) {
  const int64_t H = 3, d = 16, n = 6;
  auto q = randn(H * d, 31), e = randn(n * d, 32), sinks = randn(H, 33, 2.0f);
  std::vector<const float*> ptr;
  for (int64_t j = 0; j < n; ++j) ptr.push_back(&e[j * d]);
  std::vector<float> out(H * d);
  const float scale = 0.25f;
  attention_sink_cpu(q.data(), ptr.data(), n, sinks.data(), H, d, scale, out.data());
  for (int64_t h = 0; h < H; ++h) {
    std::vector<double> s(n + 1);
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t c = 0; c < d; ++c) s[j] += double(q[h * d + c]) * e[j * d + c];
      s[j] *= scale;
    }
    s[n] = sinks[h];
    double m = *std::max_element(s.begin(), s.end()), den = 0;
    for (double v : s) den += std::exp(v - m);
    for (int64_t c = 0; c < d; ++c) {
      double o = 0;
      for (int64_t j = 0; j < n; ++j) o += std::exp(s[j] - m) / den * e[j * d + c];
      EXPECT_NEAR(out[h * d + c], o, 1e-5);
    }
  }
  // No entries at all: the sink takes all the mass, output is zero (not NaN).
  attention_sink_cpu(q.data(), ptr.data(), 0, sinks.data(), H, d, scale, out.data());
  for (float v : out) EXPECT_EQ(v, 0.0f);
}

TEST(Linear, RowsAndFormatsMatchNaive) {
  const int64_t N = 37, K = 48, M = 3;
  auto w = randn(N * K, 41), x = randn(M * K, 42);
  LinearWeight lw = linear_from_f32("w", N, K, w.data());
  std::vector<float> y(M * N), yr(M * 10);
  linear_cpu(lw, x.data(), M, y.data());
  linear_cpu_rows(lw, 20, 10, x.data(), M, yr.data());
  for (int64_t i = 0; i < M; ++i)
    for (int64_t n = 0; n < N; ++n) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k) s += double(x[i * K + k]) * w[n * K + k];
      EXPECT_NEAR(y[i * N + n], s, 1e-4);
      if (n >= 20 && n < 30) EXPECT_EQ(yr[i * 10 + n - 20], y[i * N + n]);
    }
}
