#include "ops/kv_quant.h"

#include <algorithm>
#include <cmath>

#include "common/numeric.h"
#include "quant/codec.h"

namespace cm {

namespace {

// x / s rounded to E4M3 (RNE, saturating at 448), times s.
inline float e4m3_scaled(float x, float s) { return e4m3_to_f32(e4m3_encode(x / s, true)) * s; }

float amax_of(const float* x, int64_t n) {
  float m = 0.0f;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(x[i]));  // NaN compares false: left to the rounding
  return std::max(m, 1e-4f);
}

}  // namespace

void kv_fp8_round_cpu(float* rows, int64_t n, int64_t dim, int64_t rope_dim) {
  const int64_t nope = dim - rope_dim;
  for (int64_t r = 0; r < n; ++r) {
    float* x = rows + r * dim;
    for (int64_t b0 = 0; b0 < nope; b0 += kKvFp8Block) {
      const int64_t len = std::min(kKvFp8Block, nope - b0);
      // The UE8M0 scale: the smallest power of two >= amax / 448 (amax >= 1e-4, so always a code).
      const float s = e8m0_to_f32(e8m0_encode_ceil(amax_of(x + b0, len) / 448.0f));
      for (int64_t i = 0; i < len; ++i) x[b0 + i] = std::isinf(x[b0 + i]) ? NAN : e4m3_scaled(x[b0 + i], s);
    }
    for (int64_t i = nope; i < dim; ++i) x[i] = std::isinf(x[i]) ? NAN : round_bf16(x[i]);
  }
}

void index_key_fp8_round_cpu(float* keys, int64_t n, int64_t dim) {
  for (int64_t r = 0; r < n; ++r) {
    float* x = keys + r * dim;
    const float s = amax_of(x, dim) / 448.0f;
    for (int64_t i = 0; i < dim; ++i) x[i] = std::isinf(x[i]) ? NAN : e4m3_scaled(x[i], s);
  }
}

}  // namespace cm
