// Scalar conversions between the stored element formats and fp32. These are
// the bit-exact definitions every CPU kernel and test uses (spec §9.1).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

namespace cm {

inline float f32_from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint32_t bits_from_f32(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Little-endian f32 from 4 bytes at any alignment.
inline float f32_from_bytes(const uint8_t* p) {
  float f;
  std::memcpy(&f, p, 4);
  return f;
}

// True when any of x[0, n) is NaN or ±Inf: all exponent bits set. Branch-free
// over the whole array so the compiler vectorizes it (an early-exit loop over a
// 256-row x 129K-vocab logits block took tens of ms on the host). Both backends
// check their logits (and the CPU backend its noted intermediates) with it.
inline bool any_non_finite(const float* x, size_t n) {
  uint32_t bad = 0;
  for (size_t i = 0; i < n; ++i) bad |= uint32_t((bits_from_f32(x[i]) & 0x7f800000u) == 0x7f800000u);
  return bad != 0;
}

inline float bf16_to_f32(uint16_t h) { return f32_from_bits(uint32_t(h) << 16); }

// Round-to-nearest-even fp32 -> bf16 (NaN stays NaN).
inline uint16_t f32_to_bf16(float f) {
  uint32_t u = bits_from_f32(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
inline float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

inline float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  if (exp == 0) {
    float v = std::ldexp(float(man), -24);
    return sign ? -v : v;
  }
  if (exp == 31) return f32_from_bits(sign | 0x7f800000u | (man << 13));
  return f32_from_bits(sign | ((exp + 112) << 23) | (man << 13));
}

// E4M3 (fn): bias 7, no Inf, 0x7F/0xFF are NaN, max 448.
inline float e4m3_to_f32(uint8_t v) {
  uint32_t s = v >> 7, e = (v >> 3) & 0xf, m = v & 7;
  float r;
  if (e == 15 && m == 7) return NAN;
  if (e == 0) r = std::ldexp(float(m), -9);
  else r = std::ldexp(1.0f + float(m) / 8.0f, int(e) - 7);
  return s ? -r : r;
}
inline bool e4m3_is_nan(uint8_t v) { return (v & 0x7f) == 0x7f; }

// UE8M0: 2^(e-127), 0xFF is NaN.
inline float e8m0_to_f32(uint8_t e) {
  if (e == 0xff) return NAN;
  return std::ldexp(1.0f, int(e) - 127);
}

// E2M1 codes 0..15 (bit 3 = sign).
inline float e2m1_to_f32(uint8_t code) {
  static constexpr float kVals[16] = {0.f,  0.5f,  1.f,  1.5f,  2.f,  3.f,  4.f,  6.f,
                                      -0.f, -0.5f, -1.f, -1.5f, -2.f, -3.f, -4.f, -6.f};
  return kVals[code & 0xf];
}

}  // namespace cm
