// KV compression (spec §5.5) and the lightning indexer's top-k (§5.7).
#pragma once
#include <cstdint>
#include <vector>

namespace cm {

// Channel-wise softmax pooling: out[c] = Σ_s softmax_s(gate[s, c]) · kv[s, c]
// over `slots` rows of `dim` channels. A gate of −inf gives its slot weight 0
// (CSA's missing previous block).
void compress_pool_cpu(const float* kv, const float* gate, int64_t slots, int64_t dim, float* out);

// Lightning-indexer scores of one query against n compressed keys (spec §5.7):
// score[i] = Σ_h w[h] · ReLU(q_h · key_i) · dim^−½, with q [heads, dim],
// keys [n, dim] and w [heads] the (already scaled) head weights.
void indexer_scores_cpu(const float* q, const float* keys, int64_t n, const float* w, int64_t heads, int64_t dim,
                        float* score);
// Same without allocating: scratch [heads·kIndexerChunk] floats, key_rows [kIndexerChunk] pointers.
constexpr int64_t kIndexerChunk = 256;
void indexer_scores_cpu(const float* q, const float* keys, int64_t n, const float* w, int64_t heads, int64_t dim,
                        float* score, float* scratch, const float** key_rows);

// Indices of the k largest scores[0:n], in descending score order; equal
// scores are taken lower index first (spec §15.3). k is clamped to n.
std::vector<int32_t> topk_lower_index_first(const float* scores, int64_t n, int64_t k);
// Same without allocating: idx is scratch [n], out receives min(k, n) indices (returned count).
int64_t topk_lower_index_first(const float* scores, int64_t n, int64_t k, int32_t* idx, int32_t* out);

// --- CUDA (src/backend/cuda/compressor.cu, indexer.cu); device pointers. ---
//
// A step's tokens come as a batch: token i belongs to sequence slot[i] at
// absolute position pos[i]; a slot's tokens are contiguous and in position
// order (engine seam). The ops find a position's row either in this batch
// (row i − (pos[i] − q) when that row is the same slot at position q) or in
// the slot's state, so a chunk of any length sees what one prefill would.
namespace cuda {
class Context;
}
struct RopeView;

// One layer's compressor state for every slot, preallocated by the backend
// (plain pointers into its state buffer, laid out by backend/step_plan.h).
//   pend_kv, pend_gate: f32 [max_slots, c·m, c·dc]: the projected rows of the
//     last c·m positions, row = pos mod (c·m) — the open block and, for CSA,
//     the previous block whose A halves the next entry pools. Gates are raw
//     (ape is added when pooling).
//   entries: bf16 [max_slots, max_entries, dc], normed and RoPE'd when written;
//     entry e of a slot exists once position (e+1)·m − 1 has been processed.
// No counters: a slot's entry count is pos / m and its open block pos mod m.
struct CompressorStateView {
  float* pend_kv = nullptr;
  float* pend_gate = nullptr;
  uint16_t* entries = nullptr;
  int64_t max_slots = 0, max_entries = 0;
  int64_t ratio = 0, c = 0, dc = 0;  // m; 2 = CSA (overlapping), 1 = HCA; entry width
};

// Feeds the batch's projected rows kv, gate (f32 [n, c·dc], without ape) into
// the state: every block completed by a token is pooled (channel-wise softmax
// of gate + ape[pos mod m] over its c·m slots; CSA: the previous block's A
// halves [0, dc) then this block's B halves [dc, 2dc), absent for entry 0),
// RMSNorm'd with norm_w (eps), RoPE'd at position e·m, and stored as entry e;
// then the last c·m rows of each slot's chunk are kept. ape: f32 [m, c·dc].
void compressor_step_cuda(cuda::Context& ctx, const CompressorStateView& st, const float* ape, const float* norm_w,
                          float eps, const RopeView& rope, const float* kv, const float* gate, const int32_t* slot,
                          const int32_t* pos, int64_t n);

// Lightning-indexer scores of each batch token against its slot's causal
// index keys (entries e < (pos+1)/m of keys): score[i, e] =
// Σ_h w[i, h] · ReLU(q_i,h · K_e) · dim^−½. q bf16 [n, heads, dim] (RoPE'd),
// w f32 [n, heads]; score f32 [n, ld] (only e < the causal count written).
// max_causal: an upper bound of (pos+1)/m over the batch (sizes the grid).
// heads <= 64, heads % 4 == 0, dim <= 128, dim % 8 == 0.
void indexer_scores_cuda(cuda::Context& ctx, const CompressorStateView& keys, const uint16_t* q, const float* w,
                         int64_t heads, const int32_t* slot, const int32_t* pos, int64_t n, int64_t max_causal,
                         float* score, int64_t ld);

// Per row r: the indices of the k largest of score[r, 0 : cnt_r] in
// descending order, equal scores lower index first (−0 = +0), then −1 up to
// k; cnt_r = min((pos[r] + 1) / ratio, ld). Deterministic (radix select with
// integer histograms, then a bitonic sort of the k winners). k <= 2048.
void topk_lower_index_first_cuda(cuda::Context& ctx, const float* score, int64_t ld, const int32_t* pos,
                                 int64_t ratio, int64_t rows, int64_t k, int32_t* idx);

}  // namespace cm
