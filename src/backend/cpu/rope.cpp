#include <cmath>

#include "ops/rope.h"

namespace cm {

static void rope_row(float* v, int64_t dim, int64_t pos, const RopeTable& t, bool inverse) {
  float* r = v + dim - t.rope_dim;
  const int64_t half = t.rope_dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    // transformers: freqs = inv_freq (fp32) * position (fp32), then cos/sin in fp32.
    float ang = t.freqs[size_t(i)] * float(pos);
    float c = std::cos(ang) * t.attention_factor;
    float s = std::sin(ang) * t.attention_factor;
    if (inverse) s = -s;
    float a = r[2 * i], b = r[2 * i + 1];
    r[2 * i] = a * c - b * s;
    r[2 * i + 1] = b * c + a * s;
  }
}

void rope_apply_cpu(float* x, int64_t rows, int64_t dim, const int64_t* pos, const RopeTable& t, bool inverse) {
  for (int64_t r = 0; r < rows; ++r) rope_row(x + r * dim, dim, pos[r], t, inverse);
}

void rope_apply_cpu(float* x, int64_t rows, int64_t dim, int64_t pos, const RopeTable& t, bool inverse) {
  for (int64_t r = 0; r < rows; ++r) rope_row(x + r * dim, dim, pos, t, inverse);
}

}  // namespace cm
