// Repacking of NVFP4 and MXFP4 weights for the Hopper kernels (layout in nvfp4_pack.h).
#include "backend/cuda/linear/nvfp4_pack.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/error.h"
#include "common/numeric.h"

namespace cm::cuda {

namespace {

// Bit positions {m, e0, e1, sign} of the two codes of each bf16x2 operand
// inside one 32-bit word: operand P0 sits where bf16 wants it (mantissa MSB
// at 6, exponent LSBs at 7..8, sign at 15), P1/P2 are P0 shifted down by 3/6,
// P3 fills the remaining bits.
constexpr int kPos[4][2][4] = {
    {{6, 7, 8, 15}, {22, 23, 24, 31}},
    {{3, 4, 5, 12}, {19, 20, 21, 28}},
    {{0, 1, 2, 9}, {16, 17, 18, 25}},
    {{10, 11, 13, 14}, {26, 27, 29, 30}},
};

uint32_t place(uint32_t word, uint8_t code, const int pos[4]) {
  for (int b = 0; b < 4; ++b) word |= uint32_t((code >> b) & 1u) << pos[b];
  return word;
}
uint8_t take(uint32_t word, const int pos[4]) {
  uint8_t c = 0;
  for (int b = 0; b < 4; ++b) c |= uint8_t(((word >> pos[b]) & 1u) << b);
  return c;
}

// |E4M3| (nonzero, finite) -> unsigned E5M3 with exponent bias 9.
uint8_t encode_scale(uint8_t s) {
  float v = std::fabs(e4m3_to_f32(s));
  int ex = 0;
  float f = std::frexp(v, &ex);  // v = f * 2^ex, f in [0.5, 1)
  int e = ex - 1;
  int mant = int((2.0f * f - 1.0f) * 8.0f);
  return uint8_t(((e + kScaleExpBias) << 3) | mant);
}
float decode_scale(uint8_t enc) {
  int e = (enc >> 3) - kScaleExpBias;
  return std::ldexp(1.0f + float(enc & 7) / 8.0f, e);
}

struct BlockScale {
  uint8_t enc = 0, flip = 0;
  bool zero = true;
};

// Packs the E2M1 codes of w (both FP4 formats share the nibble layout) with
// one encoded scale byte per (row, 16-block): block_scale(n, b16) returns
// {encoded byte, sign flip (8 or 0), zero block}.
template <typename ScaleFn>
void pack_codes(const LinearWeight& w, Nvfp4Packed& p, ScaleFn&& block_scale) {
  p.N = w.out_features;
  p.K = w.in_features;
  p.row_blocks = (p.N + 15) / 16;
  p.chunks = (p.K + 63) / 64;
  p.data.assign(size_t(p.row_blocks * p.chunks) * 512, 0);
  p.scales.assign(size_t(p.row_blocks * p.chunks) * 64, 0);
  const int64_t K = p.K, kb = K / 16;
#pragma omp parallel for schedule(dynamic, 16)
  for (int64_t rb = 0; rb < p.row_blocks; ++rb) {
    for (int64_t c = 0; c < p.chunks; ++c) {
      uint8_t* dst = p.data.data() + size_t(rb * p.chunks + c) * 512;
      uint8_t* sdst = p.scales.data() + size_t(rb * p.chunks + c) * 64;
      for (int lane = 0; lane < 32; ++lane) {
        const int g = lane / 4, t = lane % 4;
        const int64_t blk = c * 4 + t;
        for (int half = 0; half < 2; ++half) {  // row g, row g+8
          const int64_t n = rb * 16 + g + 8 * half;
          BlockScale bs;
          if (n < p.N && blk < kb) bs = block_scale(n, blk);
          sdst[g * 8 + t * 2 + half] = bs.enc;
          if (bs.zero) continue;
          for (int j = 0; j < 4; ++j) {
            uint32_t word;
            std::memcpy(&word, dst + lane * 16 + j * 4, 4);
            for (int e = 0; e < 4; ++e) {  // k offsets 0..3 within the step
              const int64_t k = blk * 16 + 4 * j + e;
              uint8_t byte = w.data[n * (K / 2) + k / 2];
              uint8_t code = uint8_t(((k & 1) ? byte >> 4 : byte & 0xf) ^ bs.flip);
              // operand: row g -> P0 (k+0,1) / P2 (k+2,3); row g+8 -> P1 / P3
              const int op = (half == 0 ? 0 : 1) + (e >= 2 ? 2 : 0);
              word = place(word, code, kPos[op][e & 1]);
            }
            std::memcpy(dst + lane * 16 + j * 4, &word, 4);
          }
        }
      }
    }
  }
}

}  // namespace

Nvfp4Packed pack_nvfp4(const LinearWeight& w) {
  if (w.format == WeightFormat::MXFP4) return pack_mxfp4(w);
  CM_CHECK(w.format == WeightFormat::NVFP4, "linear '{}': expected an NVFP4 or MXFP4 weight, got {}", w.name,
           weight_format_name(w.format));
  CM_CHECK(w.in_features > 0 && w.in_features % 16 == 0, "linear '{}': NVFP4 needs K divisible by 16, got {}",
           w.name, w.in_features);
  CM_CHECK(w.data && w.scale, "linear '{}': NVFP4 weight without data or scales", w.name);
  CM_CHECK(w.scale_dtype == DType::F8_E4M3, "linear '{}': NVFP4 scales must be F8_E4M3", w.name);
  const int64_t kb = w.in_features / 16;
  for (int64_t i = 0; i < w.out_features * kb; ++i)
    CM_CHECK(!e4m3_is_nan(w.scale[i]), "linear '{}': NaN block scale at row {}, block {}", w.name, i / kb, i % kb);
  Nvfp4Packed p;
  p.scale_2 = w.scale_2;
  pack_codes(w, p, [&](int64_t n, int64_t blk) {
    BlockScale bs;
    const uint8_t s = w.scale[n * kb + blk];
    if ((s & 0x7f) != 0) bs = {encode_scale(s), uint8_t((s & 0x80) ? 8 : 0), false};
    return bs;
  });
  return p;
}

Nvfp4Packed pack_mxfp4(const LinearWeight& w) {
  CM_CHECK(w.format == WeightFormat::MXFP4, "linear '{}': expected an MXFP4 weight, got {}", w.name,
           weight_format_name(w.format));
  const int64_t N = w.out_features, K = w.in_features;
  CM_CHECK(N > 0 && K > 0 && K % 32 == 0, "linear '{}': MXFP4 needs N > 0 and K divisible by 32, got [{}, {}]", w.name,
           N, K);
  CM_CHECK(w.data && w.scale, "linear '{}': MXFP4 weight without data or scales", w.name);
  CM_CHECK(w.scale_dtype == DType::F8_E8M0, "linear '{}': MXFP4 scales must be F8_E8M0, got {}", w.name,
           dtype_name(w.scale_dtype));
  CM_CHECK((w.scale_rows == 0 && w.scale_cols == 0) || (w.scale_rows == N && w.scale_cols == K / 32),
           "linear '{}': MXFP4 scale shape [{}, {}], expected [{}, {}]", w.name, w.scale_rows, w.scale_cols, N, K / 32);
  // The packed byte holds exponents -9 .. 22 relative to scale_2 (kScaleWindow binades): put the
  // largest block exponent at the top, so every block fits exactly or the tensor is refused.
  const int64_t kb = K / 32;
  int emax = -1, emin = 256;
  for (int64_t i = 0; i < N * kb; ++i) {
    const int e = w.scale[i];
    CM_CHECK(e != 0xff, "linear '{}': MXFP4 block scale at row {}, block {} is the E8M0 NaN code 0xFF", w.name, i / kb,
             i % kb);
    emax = std::max(emax, e);
    emin = std::min(emin, e);
  }
  CM_CHECK(emax - emin < kScaleWindow,
           "linear '{}': MXFP4 block scales span 2^{} .. 2^{} ({} binades); the GPU layout holds at most {}", w.name,
           emin - 127, emax - 127, emax - emin + 1, kScaleWindow);
  const int top = kScaleWindow - 1 - kScaleExpBias;  // largest exponent of the encoded scale (22)
  const int shift = emax - 127 - top;                  // scale_2 = 2^shift
  Nvfp4Packed p;
  p.scale_2 = std::ldexp(1.0f, shift);
  pack_codes(w, p, [&](int64_t n, int64_t blk16) {
    const int e = w.scale[n * kb + blk16 / 2] - 127 - shift;  // in [top - 31, top]
    return BlockScale{uint8_t((e + kScaleExpBias) << 3), 0, false};
  });
  return p;
}

float packed_nvfp4_value(const Nvfp4Packed& p, int64_t n, int64_t k) {
  const int64_t rb = n / 16, r = n % 16, c = k / 64, t = (k % 64) / 16, j = (k % 16) / 4, e = k % 4;
  const int g = int(r % 8), half = int(r / 8);
  const int lane = g * 4 + int(t);
  const uint8_t* src = p.data.data() + size_t(rb * p.chunks + c) * 512 + lane * 16 + j * 4;
  uint32_t word;
  std::memcpy(&word, src, 4);
  const int op = half + (e >= 2 ? 2 : 0);
  uint8_t code = take(word, kPos[op][e & 1]);
  uint8_t enc = p.scales[size_t(rb * p.chunks + c) * 64 + g * 8 + t * 2 + half];
  return e2m1_to_f32(code) * decode_scale(enc) * p.scale_2;
}

}  // namespace cm::cuda
