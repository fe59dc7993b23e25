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

}  // namespace cm
