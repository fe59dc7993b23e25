// Shared helpers of the GPU tests: random NVFP4 weights (random E2M1 codes and
// random valid E4M3 block scales, including zero, subnormal and negative
// scales), bf16 activations, error norms, and the skip when no GPU exists.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "backend/cuda/core/cuda_util.h"
#include "common/numeric.h"
#include "ops/linear.h"

namespace cm::gputest {

#define CM_SKIP_WITHOUT_GPU()                                                 \
  do {                                                                        \
    if (::cm::cuda::device_count() == 0) {                                   \
      GTEST_SKIP() << "no CUDA device";                                      \
    }                                                                        \
  } while (0)

// xorshift64*: fast enough to fill hundreds of MB per test.
struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ULL + 1) {}
  uint64_t next() {
    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    return s * 0x2545F4914F6CDD1DULL;
  }
  float uniform() { return float(next() >> 40) / float(1 << 24); }  // [0, 1)
};

inline uint8_t random_scale(Rng& r) {
  const uint32_t u = uint32_t(r.next() >> 32);
  const uint32_t kind = u % 64;
  if (kind == 0) return 0x00;                     // zero block
  if (kind == 1) return uint8_t(1 + (u >> 8) % 7);  // subnormal
  uint8_t b = uint8_t(0x28 + (u >> 8) % 0x28);      // normal, about 2^-2 .. 2^3
  if (kind == 2) b |= 0x80;                       // negative scale
  return b;
}

inline LinearWeight random_nvfp4(int64_t N, int64_t K, uint64_t seed, float scale_2 = 0.03125f) {
  Rng r(seed);
  LinearWeight w;
  w.name = "test.nvfp4";
  w.format = WeightFormat::NVFP4;
  w.out_features = N;
  w.in_features = K;
  w.owned.resize(size_t(N * K / 2));
  uint64_t* q = reinterpret_cast<uint64_t*>(w.owned.data());
  size_t i = 0;
  for (; (i + 1) * 8 <= w.owned.size(); ++i) q[i] = r.next();
  for (size_t b = i * 8; b < w.owned.size(); ++b) w.owned[b] = uint8_t(r.next());
  w.owned_scale.resize(size_t(N * K / 16));
  for (auto& s : w.owned_scale) s = random_scale(r);
  w.data = w.owned.data();
  w.scale = w.owned_scale.data();
  w.scale_dtype = DType::F8_E4M3;
  w.scale_rows = N;
  w.scale_cols = K / 16;
  w.scale_2 = scale_2;
  return w;
}

// Random activations already representable in bf16: bits for the device, floats for the reference.
inline void random_bf16(size_t n, uint64_t seed, float amp, std::vector<uint16_t>& bits, std::vector<float>& vals) {
  Rng r(seed);
  bits.resize(n);
  vals.resize(n);
  for (size_t i = 0; i < n; ++i) {
    bits[i] = f32_to_bf16((2.f * r.uniform() - 1.f) * amp);
    vals[i] = bf16_to_f32(bits[i]);
  }
}

// ||a - b|| / ||b||, with a count of non-finite entries of a.
inline double rel_error(const std::vector<float>& a, const std::vector<float>& b, int64_t* nonfinite = nullptr) {
  double num = 0, den = 0;
  int64_t bad = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) ++bad;
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  if (nonfinite) *nonfinite = bad;
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

}  // namespace cm::gputest
