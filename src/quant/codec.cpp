// Element encoders, packing and the NVFP4 block quantizers; see codec.h.
#include "quant/codec.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/numeric.h"

namespace cm {

uint8_t e2m1_encode(float x) {
  if (std::isnan(x)) return 0;
  uint8_t sign = std::signbit(x) ? 8 : 0;
  float a = std::fabs(x);
  // Midpoints between grid neighbours; at a midpoint the even code wins
  // (codes 0,2,4,6 have mantissa bit 0), hence <= towards even and < away.
  uint8_t c;
  if (a <= 0.25f) c = 0;
  else if (a < 0.75f) c = 1;
  else if (a <= 1.25f) c = 2;
  else if (a < 1.75f) c = 3;
  else if (a <= 2.5f) c = 4;
  else if (a < 3.5f) c = 5;
  else if (a <= 5.0f) c = 6;
  else c = 7;
  return sign | c;
}

uint8_t e4m3_encode(float x, bool satfinite) {
  if (std::isnan(x)) return 0x7f;
  uint8_t sign = std::signbit(x) ? 0x80 : 0;
  float a = std::fabs(x);
  if (std::isinf(a)) return satfinite ? uint8_t(sign | 0x7e) : uint8_t(sign | 0x7f);
  // Quantum of the binade that holds a: subnormals (a < 2^-6) step by 2^-9,
  // binade [2^e, 2^(e+1)) steps by 2^(e-3). rint() rounds half to even in the
  // default FP environment, and a / q is exact (q is a power of two).
  int e;
  std::frexp(a, &e);  // a = f * 2^e, f in [0.5, 1)
  int exp = std::max(e - 1, -6);
  float q = std::ldexp(1.0f, exp - 3);
  float r = std::rint(a / q) * q;  // may round up into the next binade: still exact
  if (r > 448.0f) return satfinite ? uint8_t(sign | 0x7e) : uint8_t(sign | 0x7f);
  if (r == 0.0f) return sign;
  int re;
  std::frexp(r, &re);
  int be = re - 1 + 7;  // biased exponent
  uint8_t code;
  if (be <= 0) code = uint8_t(std::lround(r / std::ldexp(1.0f, -9)));  // subnormal: m * 2^-9
  else code = uint8_t((be << 3) | (std::lround(std::ldexp(r, -(re - 1)) * 8.0f) - 8));
  return sign | code;
}

uint8_t e8m0_encode_ceil(float x) {
  if (!(x > 0.0f) || !std::isfinite(x)) return 0xff;
  int e;
  float f = std::frexp(x, &e);  // x = f * 2^e, f in [0.5, 1)
  int p = (f == 0.5f) ? e - 1 : e;  // ceil(log2(x))
  if (p < -127) return 0;
  if (p > 127) return 0xff;
  return uint8_t(p + 127);
}

void e2m1_pack(const uint8_t* codes, int64_t n, uint8_t* packed) {
  for (int64_t j = 0; j < n / 2; ++j) packed[j] = uint8_t((codes[2 * j] & 0xf) | ((codes[2 * j + 1] & 0xf) << 4));
}

void e2m1_unpack(const uint8_t* packed, int64_t n, uint8_t* codes) {
  for (int64_t j = 0; j < n / 2; ++j) {
    codes[2 * j] = packed[j] & 0xf;
    codes[2 * j + 1] = packed[j] >> 4;
  }
}

float nvfp4_global_scale(float amax) { return amax > 0.0f ? amax / (6.0f * 448.0f) : 1.0f; }

// Shared block quantizer: block scale from amax * mul / 6, values x * mul / dec(s).
static void quantize_blocks16(const float* x, int64_t K, float mul, uint8_t* codes, uint8_t* scales) {
  for (int64_t b = 0; b < K / 16; ++b) {
    const float* xb = x + b * 16;
    float amax = 0.0f;
    for (int i = 0; i < 16; ++i) amax = std::max(amax, std::fabs(xb[i]));
    uint8_t s = e4m3_encode(amax * mul / 6.0f, true);
    scales[b] = s;
    float dec = e4m3_to_f32(s);
    for (int i = 0; i < 16; ++i) codes[b * 16 + i] = dec == 0.0f ? 0 : e2m1_encode(xb[i] * mul / dec);
  }
}

void nvfp4_quantize_row(const float* w, int64_t K, float scale_2, uint8_t* packed, uint8_t* scales) {
  // Division by scale_2 (not multiplication by its reciprocal) so block
  // scales land exactly where amax_b / 6 / scale_2 puts them.
  std::vector<uint8_t> codes(static_cast<size_t>(K));
  for (int64_t b = 0; b < K / 16; ++b) {
    const float* wb = w + b * 16;
    float amax = 0.0f;
    for (int i = 0; i < 16; ++i) amax = std::max(amax, std::fabs(wb[i]));
    uint8_t s = e4m3_encode(amax / 6.0f / scale_2, true);
    scales[b] = s;
    float dec = e4m3_to_f32(s) * scale_2;
    for (int i = 0; i < 16; ++i) codes[size_t(b * 16 + i)] = dec == 0.0f ? 0 : e2m1_encode(wb[i] / dec);
  }
  e2m1_pack(codes.data(), K, packed);
}

void nvfp4_quantize_activation(const float* x, int64_t K, float input_scale, uint8_t* codes, uint8_t* scales) {
  quantize_blocks16(x, K, 1.0f / input_scale, codes, scales);
}

}  // namespace cm
