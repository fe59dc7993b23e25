#include <cmath>

#include "common/error.h"
#include "ops/rope.h"

namespace cm {

// cos/sin of one position (fp32 angles, as transformers computes them), scaled by attention_factor.
static void rope_angles(int64_t pos, const RopeTable& t, bool inverse, float* c, float* s) {
  for (int64_t i = 0; i < t.rope_dim / 2; ++i) {
    float ang = t.freqs[size_t(i)] * float(pos);
    c[i] = std::cos(ang) * t.attention_factor;
    s[i] = std::sin(ang) * t.attention_factor;
    if (inverse) s[i] = -s[i];
  }
}

static void rope_row(float* v, int64_t dim, int64_t half, const float* c, const float* s) {
  float* r = v + dim - 2 * half;
  for (int64_t i = 0; i < half; ++i) {
    float a = r[2 * i], b = r[2 * i + 1];
    r[2 * i] = a * c[i] - b * s[i];
    r[2 * i + 1] = b * c[i] + a * s[i];
  }
}

void rope_apply_cpu(float* x, int64_t rows, int64_t dim, const int64_t* pos, const RopeTable& t, bool inverse) {
  for (int64_t r = 0; r < rows; ++r) rope_apply_cpu(x + r * dim, 1, dim, pos[r], t, inverse);
}

void rope_apply_cpu(float* x, int64_t rows, int64_t dim, int64_t pos, const RopeTable& t, bool inverse) {
  constexpr int64_t kMaxHalf = 256;
  const int64_t half = t.rope_dim / 2;
  if (half > kMaxHalf) fail("rope: rope dim {} above {}", t.rope_dim, 2 * kMaxHalf);
  float c[kMaxHalf], s[kMaxHalf];
  rope_angles(pos, t, inverse, c, s);
  for (int64_t r = 0; r < rows; ++r) rope_row(x + r * dim, dim, half, c, s);
}

}  // namespace cm
