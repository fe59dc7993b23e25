// What the grouped MoE kernels share (sm90_nvfp4_moe.cu: routing, decode, mma.sync prefill, combine;
// sm90_nvfp4_moe_wgmma.cu: the wgmma prefill): the launch parameters, the prefill tile size and the
// SwiGLU epilogue both paths must run identically.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "backend/cuda/core/cuda_util.h"

namespace cm::cuda {

struct DeviceExperts;
struct MoeScratch;

namespace moe {

constexpr int kPfTile = 64;  // tokens of one expert per prefill tile (the routing kernel lists the tiles)

struct MoeParams {
  const uint4 *w1, *w3, *w2;
  const uint16_t *s1, *s3, *s2;
  const float* scale2;
  int64_t stride13, stride2;  // uint4 per expert (u16 scale stride is the same number)
  int hidden, inter, ch13, ch2, count;
  float limit;
  const __nv_bfloat16* x;
  int T, topk, first;
  const int32_t* ids;
  const float* weights;
  int* offsets;  // [count + 2]: offsets[e], offsets[count] = total, offsets[count+1] = active count
  int* active;   // [count]
  int* sorted_tok;   // the (token, k) slot t·topk + k of each expert-major row
  float* sorted_w;
  __nv_bfloat16* h;  // [T*topk, inter] (the wgmma prefill: each 64-column chunk in the decode k order)
  float* yk;         // [T*topk, hidden]: one row per (token, k)
  float* y;          // [T, hidden]
  int* tiles;        // prefill: [0] = tile count, then (expert, first row in its list) pairs; null: not listed
  int all_k;         // combine every k (expert parallelism: yk holds every rank's rows after the exchange)
};

// h of one (token, k) element from the reduced gate and up sums. Not inlined:
// the decode and prefill kernels run the very same instructions (no
// contraction or reordering that could differ between the two call sites).
static __device__ __noinline__ float swiglu_h(float gsum, float usum, float sc_g, float sc_u, float limit, float w) {
  const float gg = fminf(gsum * sc_g, limit);
  const float uu = fminf(fmaxf(usum * sc_u, -limit), limit);
  return gg / (1.0f + expf(-gg)) * uu * w;
}

// The wgmma prefill path (sm90_nvfp4_moe_wgmma.cu): nullptr when it takes these experts, else why not.
const char* wgmma_unsupported(const DeviceExperts& e);
// Runs gate/up + SwiGLU and down over the listed tiles (p.tiles filled by the routing kernel; `tiles` is
// the grid's bound on their count), with the decode kernels' bits: h and yk as the other paths leave them.
void prefill_wgmma(Context& ctx, const DeviceExperts& e, MoeScratch& s, const MoeParams& p, unsigned tiles);

}  // namespace moe
}  // namespace cm::cuda
