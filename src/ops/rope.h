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

// --- CUDA (src/backend/cuda/rope.cu); all pointers are device pointers. ---
namespace cuda {
class Context;
}
// A RopeTable on the device: freqs [rope_dim / 2] uploaded once at load.
struct RopeView {
  const float* freqs = nullptr;
  int64_t rope_dim = 0;
  float attention_factor = 1.0f;
};
// y[r] = x[r] with its trailing rope_dim channels rotated at position
// pos[r / rows_per_pos] (inverse: by −φ). x and y are f32 or bf16 [rows, dim]
// (as x_bf16 / y_bf16 say) and may be the same buffer. Math in fp32.
void rope_cuda(cuda::Context& ctx, const void* x, bool x_bf16, void* y, bool y_bf16, int64_t rows, int64_t dim,
               const int32_t* pos, int64_t rows_per_pos, const RopeView& rope, bool inverse);

}  // namespace cm
