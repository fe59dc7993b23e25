// Attention core with a learned per-head sink (spec §5.2), MQA: every head
// attends to the same entries, each used as key and value (K = V).
//   s_j = (q_h · e_j)·scale;  p_j = exp(s_j − M) / (Σ_j exp(s_j − M) + exp(sink_h − M))
//   o_h = Σ_j p_j e_j            (the sink takes probability mass, has no value)
// Entries are given as row pointers so the sliding window and the compressed
// entries can be combined without copying.
#pragma once
#include <cstdint>

namespace cm {

// q: [heads, dim]; entries: n pointers to dim floats; sinks: [heads]; out: [heads, dim].
// scratch: heads·n floats (the overload without it allocates). Scores are one
// fixed-order GEMM, so a token's output does not depend on its batch.
void attention_sink_cpu(const float* q, const float* const* entries, int64_t n, const float* sinks, int64_t heads,
                        int64_t dim, float scale, float* out, float* scratch);
void attention_sink_cpu(const float* q, const float* const* entries, int64_t n, const float* sinks, int64_t heads,
                        int64_t dim, float scale, float* out);

// --- CUDA (src/backend/cuda/attention.cu); device pointers, batch as in
// ops/compressor.h (token i: slot[i], pos[i]; a slot's tokens contiguous). ---
namespace cuda {
class Context;
}
struct RopeView;

// What one layer's attention reads besides the batch.
struct AttnInputs {
  const uint16_t* kv = nullptr;      // bf16 [n, dim]: this step's KV rows (normed, RoPE'd)
  const uint16_t* window = nullptr;  // bf16 [max_slots, W, dim]: row = pos mod W (earlier steps)
  int64_t W = 0;
  const uint16_t* entries = nullptr;  // bf16 [max_slots, max_entries, dim] compressed entries, or null
  int64_t max_entries = 0;
  int64_t ratio = 0;               // m: entry e is causal for pos p iff e < (p+1)/m
  const int32_t* sel = nullptr;    // CSA: [n, topk] chosen entries (−1 = none); null = all causal (HCA)
  int64_t topk = 0;
  const float* sinks = nullptr;    // [heads]
};

// out[i, h] = attention with sink of q[i, h] over the window rows of
// positions max(0, p−W+1) … p and the compressed entries, then inverse RoPE
// at p; q bf16 [n, heads, dim], out bf16 [n, heads, dim]. One CTA per token
// holds all heads up to heads·dim = 32768 (V4-Flash's 64 × 512): each entry is
// loaded once for all of them (MQA); more heads split over CTAs of equal size.
// dim a power of two in [8, 512]; rope_dim % 8 == 0.
void attention_sink_cuda(cuda::Context& ctx, const AttnInputs& in, const uint16_t* q, int64_t heads, int64_t dim,
                         float scale, const RopeView& rope, const int32_t* slot, const int32_t* pos, int64_t n,
                         uint16_t* out);

// Keeps this step's KV rows in the window ring: the row of position p goes to
// window[slot, p mod W] unless the same chunk also holds position p + W.
// Run after attention_sink_cuda of the step.
void window_store_cuda(cuda::Context& ctx, const uint16_t* kv, uint16_t* window, int64_t W, int64_t dim,
                       const int32_t* slot, const int32_t* pos, int64_t n);

}  // namespace cm
