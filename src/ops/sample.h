// Sampling rows of logits into tokens, the same bits on the CPU and the GPU: the engine draws every
// token with it (runtime/row_sampler.h on the host; ModelBackend::sample_last_step on a device).
//
// Per row, in this order (every step exact or explicitly rounded, sample_math.h):
//   1. status: a NaN or +inf logit -> kSampleNonFinite (no token, -1).
//   2. raw logprob statistics of the row as given (max, sum of exp): the returned logprob is the chosen
//      token's under the model's own distribution (before bias, penalties, mask and temperature); with
//      top_n > 0 also the top_n largest raw logits (value descending, lowest id first on ties) and their
//      raw logprobs (OpenAI's top_logprobs).
//   3. adjustments, a sorted-free list of distinct ids per row (CSR: adj[off[r] .. off[r+1])):
//      a = logit + bias; for count > 0: a = a > 0 ? a / repetition : a * repetition (HF / llama.cpp),
//      then a -= count * frequency + presence (OpenAI). The kernel writes each adjusted value back into
//      logits and the id's original logit into adj.orig.
//   4. mask (optional, one bit per id, [rows, mask_words] u32, bit id % 32 of word id / 32; 1 = allowed):
//      disallowed ids count as -inf. No allowed finite logit -> kSampleNothingAllowed.
//   5. temperature 0: the largest allowed a, lowest id on ties (greedy).
//   6. otherwise every id gets an integer weight w = floor(exp((a - m) / T) * 2^31) (m the largest allowed
//      a, whose weight is 2^31), and the filters keep w >= a threshold (ties at a threshold are all kept):
//        top_k > 0:  the k-th largest w;
//        top_p < 1:  the largest t with sum(w : w >= t, kept by top_k) >= ceil(top_p * that set's sum);
//        min_p > 0:  ceil(min_p * 2^31);  and always w >= 1.
//   7. draw r = floor(philox(seed, counter) * Z / 2^64) over the kept sum Z and walk the kept weights in
//      id order: the token is the first whose running sum exceeds r.
// Integer weights make every sum exact, so the kept set and the token do not depend on the order of
// summation: a row gives the same token alone, among 255 others, on the CPU and on the GPU.
#pragma once
#include <cstdint>

namespace cm {

struct SampleParams {
  float temperature = 0.0f;         // 0 = greedy
  int32_t top_k = 0;                // <= 0 = off
  float top_p = 1.0f;               // >= 1 = off
  float min_p = 0.0f;               // <= 0 = off
  float repetition_penalty = 1.0f;  // on ids with count > 0
  float presence_penalty = 0.0f, frequency_penalty = 0.0f;
  uint32_t reserved = 0;
  uint64_t seed = 0;     // the request's seed
  uint64_t counter = 0;  // which draw of the request (the index of the token being sampled)
};

struct SampleAdjust {
  int32_t id = 0;     // distinct within a row
  int32_t count = 0;  // occurrences so far (penalties); 0 = bias only
  float bias = 0.0f;  // logit_bias
  float orig = 0.0f;  // written by the sampler: the id's logit before the adjustment
};

constexpr int32_t kMaxSampleTopN = 20;  // top logprobs per row (OpenAI's limit)

enum SampleStatus : int32_t { kSampleOk = 0, kSampleNonFinite = 1, kSampleNothingAllowed = 2 };

// Throws cm::Error naming the first field out of range (temperature < 0 or non-finite, top_p outside
// (0, 1], min_p outside [0, 1], repetition_penalty <= 0, non-finite penalties).
void check_sample_params(const SampleParams& p);

// The arrays of one call. logits [rows, vocab] f32 (adjusted in place); params [rows];
// adj / adj_offsets (may be null: no adjustments; adj_offsets [rows + 1]); mask [rows, mask_words] or
// null. Out: token [rows] (-1 when status != 0), logprob [rows] (NaN when status != 0), status [rows].
struct SampleArgs {
  float* logits = nullptr;
  int64_t rows = 0, vocab = 0;
  const SampleParams* params = nullptr;
  SampleAdjust* adj = nullptr;
  const int64_t* adj_offsets = nullptr;
  const uint32_t* mask = nullptr;
  int64_t mask_words = 0;  // >= ceil(vocab / 32) when mask is set
  int32_t* token = nullptr;
  float* logprob = nullptr;
  int32_t* status = nullptr;
  // top_n in [0, kMaxSampleTopN]; top_id / top_logprob [rows, top_n] (-1 / NaN for a non-finite row, or
  // past the vocabulary's end).
  int32_t top_n = 0;
  int32_t* top_id = nullptr;
  float* top_logprob = nullptr;
};

// CPU (src/backend/cpu/sample.cpp): host pointers. cm::Error on bad shapes, parameters, or an
// adjustment id outside [0, vocab).
void sample_rows_cpu(const SampleArgs& a);

// --- CUDA (src/backend/cuda/sampling/sm90_sample.cu); device pointers, params checked by the caller. ---
namespace cuda {
class Context;
}
// One cluster of CTAs per row (a fixed order per vocabulary size), so rows never interact and a row gives
// the same bits alone or in any batch. cm::Error for a vocabulary above sample_rows_cuda_max_vocab().
void sample_rows_cuda(cuda::Context& ctx, const SampleArgs& a);
int64_t sample_rows_cuda_max_vocab();

}  // namespace cm
