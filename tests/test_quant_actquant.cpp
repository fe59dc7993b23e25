// --act-quant nvfp4 (W4A4 emulation, spec §9.5) against a direct
// re-implementation of the formula written here: g = 1/input_scale,
// s_b = e4m3_satfinite(amax_b g / 6), q = e2m1_rn(x g / dec(s_b)) (0 if
// s_b = 0), y = alpha sum_b s_xb s_wb sum q_x q_w, alpha = input_scale * weight_scale_2.
#include <gtest/gtest.h>

#include <random>

#include "quant/codec.h"
#include "quant/load_linear.h"
#include "quant_test_util.h"

using namespace cm;
using namespace qt;

namespace {

// Nearest representable value by search; ties to the even code.
template <typename F>
int nearest(double a, int ncodes, F value) {  // a >= 0, positive codes only
  int best = 0;
  double bd = INFINITY;
  for (int c = 0; c < ncodes; ++c) {
    double v = value(c);
    if (std::isnan(v)) continue;
    double d = std::fabs(v - a);
    if (d < bd || (d == bd && (c & 1) == 0)) bd = d, best = c;
  }
  return best;
}
double e4m3_sat(double a) { return ref_e4m3(nearest(std::min(a, 448.0), 127, ref_e4m3)); }
double e2m1_rn(double x) {
  double a = std::min(std::fabs(x), 6.0);
  double v = ref_e2m1(nearest(a, 8, ref_e2m1));
  return x < 0 ? -v : v;
}

struct Nvfp4Tensors {
  std::vector<uint8_t> q, s;
};

// y[m, n] of the formula above, in double except where the spec's fp32 steps matter.
std::vector<double> reference(const std::vector<float>& x, int64_t M, int64_t K, const Nvfp4Tensors& w, int64_t N,
                              float input_scale, float s2) {
  std::vector<double> y(size_t(M * N));
  float g = 1.0f / input_scale;
  for (int64_t m = 0; m < M; ++m) {
    std::vector<double> qx(static_cast<size_t>(K)), sx(static_cast<size_t>(K / 16));
    for (int64_t b = 0; b < K / 16; ++b) {
      float amax = 0;
      for (int i = 0; i < 16; ++i) amax = std::max(amax, std::fabs(x[size_t(m * K + b * 16 + i)]));
      sx[size_t(b)] = e4m3_sat(double(amax * g / 6.0f));
      for (int i = 0; i < 16; ++i)
        qx[size_t(b * 16 + i)] = sx[size_t(b)] == 0 ? 0 : e2m1_rn(double(x[size_t(m * K + b * 16 + i)] * g / float(sx[size_t(b)])));
    }
    for (int64_t n = 0; n < N; ++n) {
      double acc = 0;
      for (int64_t b = 0; b < K / 16; ++b) {
        double inner = 0;
        for (int i = 0; i < 16; ++i) {
          int64_t k = b * 16 + i;
          uint8_t byte = w.q[size_t(n * K / 2 + k / 2)];
          inner += qx[size_t(k)] * ref_e2m1(k % 2 ? byte >> 4 : byte & 15);
        }
        acc += sx[size_t(b)] * ref_e4m3(w.s[size_t(n * K / 16 + b)]) * inner;
      }
      y[size_t(m * N + n)] = double(input_scale * s2) * acc;
    }
  }
  return y;
}

}  // namespace

TEST(QuantActQuant, Nvfp4MatchesDirectFormula) {
  const int64_t M = 4, N = 7, K = 96;
  std::mt19937 rng(21);
  std::normal_distribution<float> nd;
  std::vector<float> wf(size_t(N * K)), x(size_t(M * K));
  for (auto& v : wf) v = nd(rng) * 0.02f;
  for (auto& v : x) v = nd(rng);
  for (int i = 0; i < 16; ++i) x[size_t(16 + i)] = 0.0f;  // zero block: s = 0, q = 0
  for (int i = 0; i < 16; ++i) x[size_t(K + 32 + i)] = 900.0f * (i % 2 ? 1 : -1);  // saturates the E4M3 scale
  // A block on exact ties at g = 1/input_scale = 1: amax 6 -> s = 1, values at midpoints.
  const float ties[16] = {6, 2.5f, 0.25f, 5, -0.75f, 1.25f, 1.75f, 3.5f, -2.5f, -5, 0.75f, 0.1f, -6, 4, 3, 0};
  for (int i = 0; i < 16; ++i) x[size_t(2 * K + i)] = ties[i];
  const float input_scale = 1.0f;
  float amax = 0;
  for (float v : wf) amax = std::max(amax, std::fabs(v));
  float s2 = nvfp4_global_scale(amax);
  Nvfp4Tensors t{std::vector<uint8_t>(size_t(N * K / 2)), std::vector<uint8_t>(size_t(N * K / 16))};
  for (int64_t n = 0; n < N; ++n) nvfp4_quantize_row(wf.data() + n * K, K, s2, t.q.data() + n * K / 2, t.s.data() + n * K / 16);

  std::string d = tmpdir("aq");
  write_safetensors(d + "/model.safetensors",
                    {raw("lin.weight", DType::U8, {N, K / 2}, t.q), raw("lin.weight_scale", DType::F8_E4M3, {N, K / 16}, t.s),
                     scalar("lin.weight_scale_2", s2), scalar("lin.input_scale", input_scale)});
  TensorStore st = TensorStore::open_dir(d);
  LinearWeight w = load_linear(st, "lin", N, K);
  std::vector<float> y(size_t(M * N)), y_wo(size_t(M * N));
  linear_cpu(w, x.data(), M, y.data(), ActQuant::NVFP4);
  linear_cpu(w, x.data(), M, y_wo.data(), ActQuant::NONE);
  std::vector<double> ref = reference(x, M, K, t, N, input_scale, s2);
  double max_diff_wo = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    EXPECT_NEAR(y[i], ref[i], 1e-5 * std::max(1.0, std::fabs(ref[i]))) << i;
    max_diff_wo = std::max(max_diff_wo, std::fabs(double(y_wo[i]) - ref[i]));
  }
  EXPECT_GT(max_diff_wo, 1e-3);  // the activation quantization is really applied

  // A different input_scale changes the result exactly as the formula says.
  LinearWeight w2 = load_linear(st, "lin", N, K);
  w2.input_scale = 0.37f;
  linear_cpu(w2, x.data(), M, y.data(), ActQuant::NVFP4);
  ref = reference(x, M, K, t, N, 0.37f, s2);
  for (size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(y[i], ref[i], 1e-5 * std::max(1.0, std::fabs(ref[i]))) << i;

  // Missing / bad input_scale is an error naming the linear, never NaN.
  w2.input_scale = 0.0f;
  EXPECT_NE(error_of([&] { linear_cpu(w2, x.data(), M, y.data(), ActQuant::NVFP4); }).find("linear 'lin'"), std::string::npos);
}

TEST(QuantActQuant, WeightOnlyFormatsIgnoreIt) {
  const int64_t N = 3, K = 32;
  std::vector<float> wf(size_t(N * K)), x(size_t(2 * K));
  for (size_t i = 0; i < wf.size(); ++i) wf[i] = float(int(i % 13) - 6) * 0.1f;
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(int(i % 7) - 3) * 0.3f;
  LinearWeight w = linear_from_f32("f", N, K, wf.data());
  std::vector<float> a(size_t(2 * N)), b(size_t(2 * N));
  linear_cpu(w, x.data(), 2, a.data(), ActQuant::NONE);
  linear_cpu(w, x.data(), 2, b.data(), ActQuant::NVFP4);
  EXPECT_EQ(a, b);
}

// The grouped output projection calls linear_cpu_rows on a row block: same
// values as the matching rows of the full call, W4A4 included.
TEST(QuantActQuant, RowBlockMatchesFullCall) {
  const int64_t M = 2, N = 6, K = 32;
  std::vector<uint8_t> q(size_t(N * K / 2)), s(size_t(N * K / 16));
  for (size_t i = 0; i < q.size(); ++i) q[i] = uint8_t(i * 37 + 11);
  for (size_t i = 0; i < s.size(); ++i) s[i] = uint8_t(0x30 + i);
  std::vector<float> x(size_t(M * K));
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(float(i)) * 3.0f;
  std::string d = tmpdir("rows");
  write_safetensors(d + "/model.safetensors",
                    {raw("r.weight", DType::U8, {N, K / 2}, q), raw("r.weight_scale", DType::F8_E4M3, {N, K / 16}, s),
                     scalar("r.weight_scale_2", 0.5f), scalar("r.input_scale", 0.01f)});
  TensorStore st = TensorStore::open_dir(d);
  LinearWeight w = load_linear(st, "r", N, K);
  for (ActQuant aq : {ActQuant::NONE, ActQuant::NVFP4}) {
    std::vector<float> full(size_t(M * N)), part(size_t(M * 3));
    linear_cpu(w, x.data(), M, full.data(), aq);
    linear_cpu_rows(w, 2, 3, x.data(), M, part.data(), aq);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t r = 0; r < 3; ++r) EXPECT_EQ(part[size_t(m * 3 + r)], full[size_t(m * N + 2 + r)]);
  }
}
