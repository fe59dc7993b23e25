// Clamped SwiGLU of the experts (spec §7): with limit L > 0,
//   h = silu(min(g, L)) · clamp(u, −L, L)      (L <= 0: no clamp)
// in fp32, optionally times a per-row weight (the routing weight, applied
// before the down projection as the official code does).
#pragma once
#include <cstdint>

namespace cm {

// g, u, h: [n] (h may alias g).
void swiglu_cpu(const float* g, const float* u, int64_t n, float limit, float* h);

// --- CUDA (src/backend/cuda/swiglu.cu); device pointers. ---
namespace cuda {
class Context;
}
// h[r, :] = swiglu(g[r, :], u[r, :]) · (row_weight ? row_weight[r] : 1) for
// rows r < rows of `cols` values; g and u rows are ldg apart (g and u may be
// the two halves of one fused gate/up output), h is bf16 or f32 [rows, cols].
void swiglu_cuda(cuda::Context& ctx, const float* g, const float* u, int64_t ldg, int64_t rows, int64_t cols,
                 float limit, const float* row_weight, void* h, bool h_bf16);

}  // namespace cm
