// Element codecs (spec §9.1): every E2M1/E4M3/E8M0 code against a value
// re-derived here from its bit fields, RNE ties, saturation, nibble packing,
// and the NVFP4 block quantizer's error bound.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "common/numeric.h"
#include "quant/codec.h"
#include "quant_test_util.h"

using namespace cm;
using qt::ref_e2m1;
using qt::ref_e4m3;

namespace {
// Nearest code by exhaustive search; ties go to the code with even mantissa (bit 0 clear).
template <typename F>
int ref_nearest(double x, int ncodes, F value) {
  int best = -1;
  double bd = INFINITY;
  for (int c = 0; c < ncodes; ++c) {
    double v = value(c);
    if (std::isnan(v) || std::signbit(v) != std::signbit(x) ) continue;
    double d = std::fabs(v - x);
    if (d < bd || (d == bd && (c & 1) == 0 && (best & 1) == 1)) bd = d, best = c;
  }
  return best;
}
}  // namespace

TEST(QuantCodec, E2M1AllCodes) {
  for (int c = 0; c < 16; ++c) {
    double v = ref_e2m1(c);
    EXPECT_EQ(double(e2m1_to_f32(uint8_t(c))), v) << c;
    EXPECT_EQ(std::signbit(e2m1_to_f32(uint8_t(c))), c >= 8) << c;
    EXPECT_EQ(e2m1_encode(float(c >= 8 && v == 0 ? -0.0 : v)), c) << c;
  }
}

TEST(QuantCodec, E2M1RoundNearestEven) {
  // Spec ties: 0.25->0, 0.75->1, 2.5->2, 5->4; plus 1.25->1, 1.75->2, 3.5->4.
  EXPECT_EQ(e2m1_round(0.25f), 0.0f);
  EXPECT_EQ(e2m1_round(0.75f), 1.0f);
  EXPECT_EQ(e2m1_round(1.25f), 1.0f);
  EXPECT_EQ(e2m1_round(1.75f), 2.0f);
  EXPECT_EQ(e2m1_round(2.5f), 2.0f);
  EXPECT_EQ(e2m1_round(3.5f), 4.0f);
  EXPECT_EQ(e2m1_round(5.0f), 4.0f);
  EXPECT_EQ(e2m1_round(-5.0f), -4.0f);
  EXPECT_EQ(e2m1_round(0.2500001f), 0.5f);
  EXPECT_EQ(e2m1_round(5.0001f), 6.0f);
  EXPECT_EQ(e2m1_round(100.0f), 6.0f);  // saturates
  EXPECT_EQ(e2m1_round(-INFINITY), -6.0f);
  EXPECT_EQ(e2m1_encode(NAN), 0);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-7.f, 7.f);
  for (int i = 0; i < 20000; ++i) {
    float x = u(rng);
    int want = ref_nearest(std::min(std::max(double(x), -6.0), 6.0), 16, ref_e2m1);
    ASSERT_EQ(e2m1_encode(x), want) << x;
  }
}

TEST(QuantCodec, E4M3AllCodes) {
  for (int c = 0; c < 256; ++c) {
    double v = ref_e4m3(c);
    float got = e4m3_to_f32(uint8_t(c));
    if (std::isnan(v)) {
      EXPECT_TRUE(std::isnan(got)) << c;
      EXPECT_TRUE(e4m3_is_nan(uint8_t(c))) << c;
      continue;
    }
    EXPECT_FALSE(e4m3_is_nan(uint8_t(c))) << c;
    EXPECT_EQ(double(got), v) << c;
    float x = float(c == 0x80 ? -0.0 : v);
    EXPECT_EQ(e4m3_encode(x, false), c) << c;
    EXPECT_EQ(e4m3_encode(x, true), c) << c;
  }
  EXPECT_EQ(ref_e4m3(0x7e), 448.0);
  EXPECT_EQ(ref_e4m3(0x01), std::ldexp(1.0, -9));
}

TEST(QuantCodec, E4M3RoundingAndSaturation) {
  // Every midpoint between neighbouring positive finite codes rounds to the
  // even code; just above/below rounds to the nearer one.
  for (int c = 0; c < 0x7e; ++c) {
    float lo = float(ref_e4m3(c)), hi = float(ref_e4m3(c + 1));
    float mid = 0.5f * (lo + hi);
    int even = (c & 1) ? c + 1 : c;
    EXPECT_EQ(e4m3_encode(mid, false), even) << c;
    EXPECT_EQ(e4m3_encode(-mid, true), 0x80 | even) << c;
    EXPECT_EQ(e4m3_encode(std::nextafter(mid, 1e9f), false), c + 1) << c;
    EXPECT_EQ(e4m3_encode(std::nextafter(mid, 0.f), false), c) << c;
  }
  // Above 448: 464 is the tie with the (non-existent) 480 -> 448; beyond it
  // a non-saturating conversion gives NaN, satfinite gives 448.
  EXPECT_EQ(e4m3_encode(460.f, false), 0x7e);
  EXPECT_EQ(e4m3_encode(464.f, false), 0x7e);
  EXPECT_EQ(e4m3_encode(465.f, false), 0x7f);
  EXPECT_EQ(e4m3_encode(465.f, true), 0x7e);
  EXPECT_EQ(e4m3_encode(-1e9f, false), 0xff);
  EXPECT_EQ(e4m3_encode(-1e9f, true), 0xfe);
  EXPECT_EQ(e4m3_encode(INFINITY, false), 0x7f);
  EXPECT_EQ(e4m3_encode(INFINITY, true), 0x7e);
  EXPECT_TRUE(e4m3_is_nan(e4m3_encode(NAN, true)));
  EXPECT_EQ(e4m3_encode(std::ldexp(1.0f, -11), true), 0);      // below half the smallest subnormal: 0
  EXPECT_EQ(e4m3_encode(std::ldexp(1.5f, -10), true), 0x01);   // 0.75 quantum -> 1
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> u(-12.f, 9.f);
  for (int i = 0; i < 20000; ++i) {
    float x = std::ldexp(1.0f + float(i % 97) / 97.f, int(u(rng)));
    int want = ref_nearest(x, 128, ref_e4m3);
    ASSERT_EQ(e4m3_encode(x, true), want) << x;
  }
}

TEST(QuantCodec, E8M0AllCodes) {
  for (int c = 0; c < 256; ++c) {
    float got = e8m0_to_f32(uint8_t(c));
    if (c == 255) {
      EXPECT_TRUE(std::isnan(got));
      continue;
    }
    EXPECT_EQ(double(got), std::pow(2.0, c - 127)) << c;
    EXPECT_EQ(e8m0_encode_ceil(got), c) << c;
    if (c < 254 && c > 0) EXPECT_EQ(e8m0_encode_ceil(got * 1.5f), c + 1) << c;  // rounds up
  }
  EXPECT_EQ(e8m0_encode_ceil(0.0f), 0xff);
  EXPECT_EQ(e8m0_encode_ceil(-1.0f), 0xff);
  EXPECT_EQ(e8m0_encode_ceil(NAN), 0xff);
  EXPECT_EQ(e8m0_encode_ceil(1e-45f), 0);
}

TEST(QuantCodec, PackUnpack) {
  std::vector<uint8_t> codes(64), back(64), packed(32);
  for (int i = 0; i < 64; ++i) codes[size_t(i)] = uint8_t((i * 7 + 3) % 16);
  e2m1_pack(codes.data(), 64, packed.data());
  for (int j = 0; j < 32; ++j) {
    EXPECT_EQ(packed[size_t(j)] & 0xf, codes[size_t(2 * j)]);  // even index in the low nibble
    EXPECT_EQ(packed[size_t(j)] >> 4, codes[size_t(2 * j + 1)]);
  }
  e2m1_unpack(packed.data(), 64, back.data());
  EXPECT_EQ(back, codes);
}

TEST(QuantCodec, Nvfp4RowErrorBound) {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.f, 1.f);
  const int K = 256;
  std::vector<float> w(K);
  for (int i = 0; i < K; ++i) w[size_t(i)] = nd(rng) * (i < 16 ? 1e-3f : 1.0f);  // one tiny block
  for (int i = 32; i < 48; ++i) w[size_t(i)] = 0.f;                              // one zero block
  float amax = 0;
  for (float v : w) amax = std::max(amax, std::fabs(v));
  float s2 = nvfp4_global_scale(amax);
  EXPECT_FLOAT_EQ(s2, amax / 2688.f);
  std::vector<uint8_t> q(K / 2), s(K / 16), codes(K);
  nvfp4_quantize_row(w.data(), K, s2, q.data(), s.data());
  e2m1_unpack(q.data(), K, codes.data());
  for (int b = 0; b < K / 16; ++b) {
    float bmax = 0;
    for (int i = 0; i < 16; ++i) bmax = std::max(bmax, std::fabs(w[size_t(b * 16 + i)]));
    // The block scale is the E4M3 RNE of amax_b/6/s2 (independently re-derived by search).
    EXPECT_EQ(s[size_t(b)], ref_nearest(double(bmax / 6.f / s2), 128, ref_e4m3)) << b;
    float dec = float(ref_e4m3(s[size_t(b)])) * s2;
    for (int i = 0; i < 16; ++i) {
      float x = w[size_t(b * 16 + i)];
      float y = float(ref_e2m1(codes[size_t(b * 16 + i)])) * dec;
      // Grid gap <= 2 (between 4 and 6) -> error <= 1 quantum; the E4M3 scale
      // rounding (<= 1/16 relative) can clip at most 6/16 quanta: both <= dec.
      EXPECT_LE(std::fabs(x - y), dec * 1.0001f + 1e-30f) << b << " " << i;
      EXPECT_LE(std::fabs(x - y), bmax / 6.f * (17.f / 16.f) * 1.0001f + 1e-30f);
    }
  }
  EXPECT_EQ(s[2], 0);  // zero block: scale 0, codes 0
  // Values already on the grid with a 448 block scale round-trip exactly.
  std::vector<float> g(32);
  for (int i = 0; i < 32; ++i) g[size_t(i)] = float(ref_e2m1(i % 16)) * 0.125f;
  g[15] = 6 * 0.125f;  // each block's amax = 6 * 0.125
  g[31] = -6 * 0.125f;
  std::vector<uint8_t> q2(16), s2b(2), c2(32);
  nvfp4_quantize_row(g.data(), 32, nvfp4_global_scale(0.75f), q2.data(), s2b.data());
  e2m1_unpack(q2.data(), 32, c2.data());
  EXPECT_EQ(s2b[0], 0x7e);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(float(ref_e2m1(c2[size_t(i)])) * 0.125f, g[size_t(i)]) << i;
}

// any_non_finite (both backends' check of returned logits and noted intermediates): NaN, +Inf and -Inf anywhere, at every position
// of arrays of several lengths (the vectorized body and its tail); the largest finite values, denormals,
// zeros and negative zeros are finite.
TEST(Numeric, AnyNonFiniteFindsEveryKindAtEveryPosition) {
  const float finite[] = {0.f, -0.f, 3.4028235e38f, -3.4028235e38f, 1e-45f, -1e-40f, 1.f};
  const float bad[] = {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(),
                       std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                       std::numeric_limits<float>::signaling_NaN()};
  for (size_t n : {size_t(1), size_t(7), size_t(8), size_t(33), size_t(1000)}) {
    std::vector<float> x(n);
    for (size_t i = 0; i < n; ++i) x[i] = finite[i % 7];
    EXPECT_FALSE(any_non_finite(x.data(), n)) << n;
    for (size_t at : {size_t(0), n / 2, n - 1})
      for (float b : bad) {
        std::vector<float> y = x;
        y[at] = b;
        EXPECT_TRUE(any_non_finite(y.data(), n)) << n << " " << at;
        EXPECT_FALSE(any_non_finite(y.data(), at)) << "only the first " << at << " values are read";
      }
  }
  EXPECT_FALSE(any_non_finite(nullptr, 0));
}
