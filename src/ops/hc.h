// Manifold-constrained hyper-connections (mHC), spec §4. The residual stream
// of a token is `hc` parallel streams of D values, X [hc, D] (stream-major).
//
//  hc_pre:  mixes = (X_flat · fnᵀ) / rms(X_flat); pre = σ(.)+eps, post = 2σ(.),
//           comb = Sinkhorn(softmax rows of the hc×hc logits) — 1 softmax, then
//           column/row normalisations (iters total column passes, iters−1 row
//           passes); returns collapsed a = Σ_k pre_k X_k.
//  hc_post: X'_k = post_k · out + Σ_j comb[j][k] · X_j   (note the transpose).
//  hc_head: pre = σ(mixes·scale + base) + eps; y = Σ_k pre_k X_k.
#pragma once
#include <cstddef>
#include <cstdint>

namespace cm {

struct HcParams {
  const float* fn = nullptr;    // [(2+hc)·hc, hc·D]
  const float* base = nullptr;  // [(2+hc)·hc]
  const float* scale = nullptr; // [3]
  int64_t hc = 0, dim = 0;
  int64_t sinkhorn_iters = 0;
  float hc_eps = 0, norm_eps = 0;
};

// Per token t of T: X [T, hc, D] -> collapsed [T, D], post [T, hc], comb [T, hc, hc].
// The mixes are one fixed-order fp32 GEMM over the step's tokens (batch-invariant).
// scratch: hc_pre_scratch_floats(hc, D, T) floats; the overload without it allocates.
void hc_pre_cpu(const HcParams& p, const float* x, int64_t tokens, float* collapsed, float* post, float* comb,
                float* scratch);
void hc_pre_cpu(const HcParams& p, const float* x, int64_t tokens, float* collapsed, float* post, float* comb);
size_t hc_pre_scratch_floats(int64_t hc, int64_t dim, int64_t tokens);
// In place on X [T, hc, D] with out [T, D].
void hc_post_cpu(int64_t hc, int64_t dim, const float* out, const float* post, const float* comb, int64_t tokens,
                 float* x);
// Sinkhorn normalisation of one hc×hc logits matrix (row-major, j = row), in place.
void hc_sinkhorn(float* c, int64_t hc, int64_t iters, float eps);

struct HcHeadParams {
  const float* fn = nullptr;     // [hc, hc·D]
  const float* base = nullptr;   // [hc]
  const float* scale = nullptr;  // [1]
  int64_t hc = 0, dim = 0;
  float hc_eps = 0, norm_eps = 0;
};
void hc_head_cpu(const HcHeadParams& p, const float* x, int64_t tokens, float* y, float* scratch);
void hc_head_cpu(const HcHeadParams& p, const float* x, int64_t tokens, float* y);
size_t hc_head_scratch_floats(int64_t hc, int64_t dim, int64_t tokens);

// --- CUDA (src/backend/cuda/hc.cu). Same math and layouts, all fp32; the
// params' fn/base/scale and every array are device pointers. hc <= 4. ---
namespace cuda {
class Context;
}
// scratch: hc_mix_scratch_floats(hc, dim, tokens) floats of device memory (the
// dot products' partial sums; enough for hc_pre and hc_head).
size_t hc_mix_scratch_floats(int64_t hc, int64_t dim, int64_t tokens);
void hc_pre_cuda(cuda::Context& ctx, const HcParams& p, const float* x, int64_t tokens, float* collapsed, float* post,
                 float* comb, float* scratch);
void hc_post_cuda(cuda::Context& ctx, int64_t hc, int64_t dim, const float* out, const float* post, const float* comb,
                  int64_t tokens, float* x);
void hc_head_cuda(cuda::Context& ctx, const HcHeadParams& p, const float* x, int64_t tokens, float* y, float* scratch);

// The fused forms the GPU step runs (fewer kernels per layer at decode), each with the bits of the
// unfused sequence it replaces.
// Where the RMSNorm of the collapsed rows goes: rms_norm_cuda(collapsed, w, T, D, eps, y, false,
// ..., y_copy_bf16) — y f32 [T, D], and its bf16 copy unless null. D <= 12288.
struct HcNormOut {
  const float* w = nullptr;  // [D]; null: unweighted
  float eps = 0;
  float* y = nullptr;
  uint16_t* y_copy_bf16 = nullptr;
};
// hc_pre_cuda, then the RMSNorm of the collapsed rows, in the finishing kernel; collapsed may be null
// (not written). partials_ready: scratch already holds the partial sums of this hc_pre over x
// (hc_post_mix_cuda wrote them); then only the finishing kernel runs.
void hc_pre_norm_cuda(cuda::Context& ctx, const HcParams& p, const float* x, int64_t tokens, float* collapsed,
                      float* post, float* comb, float* scratch, const HcNormOut& norm, bool partials_ready = false);
// hc_head_cuda, then the RMSNorm of y, in the finishing kernel.
void hc_head_norm_cuda(cuda::Context& ctx, const HcHeadParams& p, const float* x, int64_t tokens, float* scratch,
                       const HcNormOut& norm);
// hc_post out of place: x_out = HCPost(x_in) (x_in is not written; the two must not overlap), and,
// when next is not null, the partial sums of hc_pre(next, x_out) into scratch, in the same kernel;
// hc_pre_norm_cuda(next, x_out, ..., partials_ready = true) completes that hc_pre. next null: the
// post alone (x_in == x_out allowed: in place, as hc_post_cuda).
void hc_post_mix_cuda(cuda::Context& ctx, int64_t hc, int64_t dim, const float* out, const float* post,
                      const float* comb, int64_t tokens, const float* x_in, float* x_out, const HcParams* next,
                      float* scratch);

}  // namespace cm
