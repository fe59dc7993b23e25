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

}  // namespace cm
