// RMSNorm (spec §2): y = w ⊙ x / sqrt(mean(x²) + eps), statistics in fp32.
// Unweighted when w is null. Applied independently to `rows` vectors of `dim`.
#pragma once
#include <cstdint>

namespace cm {

void rms_norm_cpu(const float* x, const float* w, int64_t rows, int64_t dim, float eps, float* y);

// --- CUDA (src/backend/cuda/norm.cu); all pointers are device pointers. ---
namespace cuda {
class Context;
}
struct RopeView;
// y[r] = w ⊙ x[r] / sqrt(mean(x[r]²) + eps) (w null: unweighted) over f32 rows,
// written as f32 or bf16 (the cast for the next linear happens here). With a
// rope, the trailing rope->rope_dim channels of the normed row are then rotated
// at position pos[r / rows_per_pos] (per-head Q norm + RoPE, KV norm + RoPE).
// x and y may be the same buffer when y is f32. dim <= 12288.
// y_copy_bf16 (f32 y only; null: none): also the bf16 of every f32 value written to y, the bits
// cast_f32_bf16 would give, for the FP8/NVFP4 linears that read y (no cast kernel per linear).
void rms_norm_cuda(cuda::Context& ctx, const float* x, const float* w, int64_t rows, int64_t dim, float eps, void* y,
                   bool y_bf16, const RopeView* rope = nullptr, const int32_t* pos = nullptr,
                   int64_t rows_per_pos = 1, uint16_t* y_copy_bf16 = nullptr);

// rms_norm_cuda's arguments, for rms_norm2_cuda.
struct RmsNormJob {
  const float* x = nullptr;
  const float* w = nullptr;
  int64_t rows = 0, dim = 0;
  float eps = 0;
  void* y = nullptr;
  bool y_bf16 = false;
  const RopeView* rope = nullptr;
  const int32_t* pos = nullptr;
  int64_t rows_per_pos = 1;
  uint16_t* y_copy_bf16 = nullptr;
};
// rms_norm_cuda(a) and rms_norm_cuda(b) in one launch (the per-head Q norm + RoPE and the KV norm +
// RoPE of a step), each row with the bits of its own call; a.dim == b.dim. The two must not overlap.
void rms_norm2_cuda(cuda::Context& ctx, const RmsNormJob& a, const RmsNormJob& b);

}  // namespace cm
