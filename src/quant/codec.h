// Element encoders and nibble packing for the quantized formats (spec §9.1).
// Decoding lives in common/numeric.h; this is the other direction, used by the
// quantizer, the W4A4 activation emulation and the tests. Every rounding is
// round-to-nearest-even, as the hardware conversions (cvt.rn.satfinite) do.
#pragma once
#include <cstdint>

#include "common/numeric.h"

namespace cm {

// fp32 -> E2M1 code (bit 3 = sign), RNE onto {0, .5, 1, 1.5, 2, 3, 4, 6};
// |x| > 6 saturates to 6 (E2M1 has no Inf/NaN); NaN encodes as +0.
// Negative inputs keep the sign bit even when they round to zero (-0 = 0x8).
uint8_t e2m1_encode(float x);
inline float e2m1_round(float x) { return e2m1_to_f32(e2m1_encode(x)); }  // decode(encode(x))

// fp32 -> E4M3 (fn) code, RNE. satfinite: |x| beyond the largest finite value
// (448) and +-Inf become +-448. Without it they become NaN (0x7F/0xFF), which
// is what a non-saturating conversion produces (E4M3 has no Inf). NaN -> 0x7F.
uint8_t e4m3_encode(float x, bool satfinite);

// fp32 -> UE8M0 code: the smallest power of two >= x (the rounding DeepSeek
// and OCP MX use for block scales, so the scaled block never overflows).
// x <= 2^-127 gives code 0; x > 2^127, Inf, NaN or x <= 0 give 0xFF (NaN).
uint8_t e8m0_encode_ceil(float x);

// Packs n E2M1 codes (n even) into n/2 bytes: element 2j in the low nibble,
// 2j+1 in the high nibble. unpack is the inverse.
void e2m1_pack(const uint8_t* codes, int64_t n, uint8_t* packed);
void e2m1_unpack(const uint8_t* packed, int64_t n, uint8_t* codes);

// NVFP4 global weight scale: amax(W) / (6 * 448); 1 when W is all zero so
// that every block scale is 0 and the weight decodes to zeros.
float nvfp4_global_scale(float amax);

// Quantizes one row of K values (K % 16 == 0) to NVFP4 with global scale
// scale_2: block scale s_b = e4m3_satfinite(amax_b / 6 / scale_2), values
// e2m1_rn(w / (dec(s_b) * scale_2)) (0 where s_b == 0). Writes K/2 packed bytes
// and K/16 E4M3 scales.
void nvfp4_quantize_row(const float* w, int64_t K, float scale_2, uint8_t* packed, uint8_t* scales);

// W4A4 activation emulation (spec §9.5): quantizes one activation row with
// global scale g = 1/input_scale into E2M1 codes (unpacked, one per element)
// and per-16 E4M3 block scales: s_b = e4m3_satfinite(amax_b * g / 6),
// q = e2m1_rn(x * g / dec(s_b)) (0 if s_b == 0).
void nvfp4_quantize_activation(const float* x, int64_t K, float input_scale, uint8_t* codes, uint8_t* scales);

}  // namespace cm
