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
  // fp32 scratch of the split (flash-decoding) path, or null: always the
  // in-CTA path. workspace_floats: its capacity; a step that needs more
  // (attention_split_floats) takes the in-CTA path. Same bits either way.
  float* workspace = nullptr;
  int64_t workspace_floats = 0;
};

// out[i, h] = attention with sink of q[i, h] over the window rows of
// positions max(0, p−W+1) … p and the compressed entries, then inverse RoPE
// at p; q bf16 [n, heads, dim], out bf16 [n, heads, dim].
// One algorithm per (token, head) whatever runs it: the candidates (window
// rows, then entries) are cut into fixed segments of 64; each segment gives
// (m_s = max score, l_s = Σ exp(s − m_s), o_s = Σ exp(s − m_s)·e), and the
// segments merge in order into the sink state (m = sink, l = 1, o = 0);
// out = o / l. Heads go to CTAs in groups of up to 16 (each entry loaded once
// per group: MQA). Two paths give the same bits: in-CTA (a CTA per token and
// head group walks all segments: prefill) and split (a CTA per token, head
// group and segment writes its partials to in.workspace, a second kernel
// merges them: decode, when attention_takes_split). So a token's output
// depends neither on its batch nor on the path.
// dim a power of two in [8, 512]; rope_dim % 8 == 0.
void attention_sink_cuda(cuda::Context& ctx, const AttnInputs& in, const uint16_t* q, int64_t heads, int64_t dim,
                         float scale, const RopeView& rope, const int32_t* slot, const int32_t* pos, int64_t n,
                         uint16_t* out);

// Workspace floats the split path needs for n tokens of at most
// max_candidates candidates each (window rows + top-k or entries).
int64_t attention_split_floats(int64_t heads, int64_t dim, int64_t max_candidates, int64_t n);
// Whether attention_sink_cuda takes the split path for these inputs: a
// workspace large enough, more than one segment, and few tokens (the in-CTA
// grid, n × head groups, under 2 × the SM count).
bool attention_takes_split(const cuda::Context& ctx, const AttnInputs& in, int64_t heads, int64_t dim, int64_t n);

// Keeps this step's KV rows in the window ring: the row of position p goes to
// window[slot, p mod W] unless the same chunk also holds position p + W.
// Run after attention_sink_cuda of the step.
void window_store_cuda(cuda::Context& ctx, const uint16_t* kv, uint16_t* window, int64_t W, int64_t dim,
                       const int32_t* slot, const int32_t* pos, int64_t n);

}  // namespace cm
