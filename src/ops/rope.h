// Interleaved partial RoPE on the trailing rope_dim channels of each vector
// (layout [nope | rope], pairs (2i, 2i+1)), spec §2. Angle φ_i = pos · f_i.
// inverse = true rotates by −φ (used on the attention output).
// cos/sin are computed in fp32 from fp32 angles, as transformers does, and
// multiplied by `attention_factor`.
#pragma once
#include <cstdint>
#include <vector>

namespace cm {

struct RopeTable {
  std::vector<float> freqs;  // f_i, i < rope_dim/2
  float attention_factor = 1.0f;
  int64_t rope_dim = 0;
};

// x: [rows, dim]; rotates x[r, dim-rope_dim : dim] in place at position pos[r].
void rope_apply_cpu(float* x, int64_t rows, int64_t dim, const int64_t* pos, const RopeTable& t, bool inverse);
// Same, with one position for all rows (e.g. the heads of one token).
void rope_apply_cpu(float* x, int64_t rows, int64_t dim, int64_t pos, const RopeTable& t, bool inverse);

}  // namespace cm
