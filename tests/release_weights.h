// Random weights in DeepSeek's release formats (spec 9.2, 9.3) for the host
// packer tests (tests/test_release_pack.cpp) and the GPU tests (tests/gpu):
// MXFP4 (random E2M1 codes, E8M0 scales over a chosen exponent range) and
// FP8 128x128-block (random non-NaN E4M3 codes incl. subnormals and -0, E8M0
// or F32 scales, the latter powers of two or arbitrary). No CUDA dependency.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>

#include "ops/linear.h"

namespace cm::testw {

// MXFP4 [N, K] with E8M0 codes uniform in [e_lo, e_hi].
inline LinearWeight random_mxfp4(int64_t N, int64_t K, uint64_t seed, int e_lo = 118, int e_hi = 126,
                                 std::string name = "test.mxfp4") {
  std::mt19937_64 r(seed);
  LinearWeight w;
  w.name = std::move(name);
  w.format = WeightFormat::MXFP4;
  w.out_features = N;
  w.in_features = K;
  w.owned.resize(size_t(N * K / 2));
  for (auto& b : w.owned) b = uint8_t(r());
  std::uniform_int_distribution<int> e(e_lo, e_hi);
  w.owned_scale.resize(size_t(N * K / 32));
  for (auto& s : w.owned_scale) s = uint8_t(e(r));
  w.data = w.owned.data();
  w.scale = w.owned_scale.data();
  w.scale_dtype = DType::F8_E8M0;
  w.scale_rows = N;
  w.scale_cols = K / 32;
  return w;
}

enum class Fp8Scales { E8M0, F32_POW2, F32_ANY };

// FP8-block [N, K]: E4M3 codes uniform over the 254 non-NaN codes; scales
// around 2^-12 .. 2^-6 (E8M0 or F32 powers of two) or arbitrary F32 in that range.
inline LinearWeight random_fp8(int64_t N, int64_t K, uint64_t seed, Fp8Scales kind, std::string name = "test.fp8") {
  std::mt19937_64 r(seed);
  LinearWeight w;
  w.name = std::move(name);
  w.format = WeightFormat::FP8_BLOCK;
  w.out_features = N;
  w.in_features = K;
  w.owned.resize(size_t(N * K));
  for (auto& b : w.owned) {
    b = uint8_t(r());
    if ((b & 0x7f) == 0x7f) b ^= 0x01;  // NaN -> the largest finite code of that sign
  }
  w.scale_rows = (N + 127) / 128;
  w.scale_cols = (K + 127) / 128;
  const size_t ns = size_t(w.scale_rows * w.scale_cols);
  std::uniform_int_distribution<int> e(127 - 12, 127 - 6);
  if (kind == Fp8Scales::E8M0) {
    w.scale_dtype = DType::F8_E8M0;
    w.owned_scale.resize(ns);
    for (auto& s : w.owned_scale) s = uint8_t(e(r));
  } else {
    w.scale_dtype = DType::F32;
    w.owned_scale.resize(ns * 4);
    std::uniform_real_distribution<float> m(1.0f, 2.0f);
    for (size_t i = 0; i < ns; ++i) {
      const float v = std::ldexp(kind == Fp8Scales::F32_POW2 ? 1.0f : m(r), e(r) - 127);
      std::memcpy(&w.owned_scale[i * 4], &v, 4);
    }
  }
  w.data = w.owned.data();
  w.scale = w.owned_scale.data();
  return w;
}

}  // namespace cm::testw
