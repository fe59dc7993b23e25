// The server's reservation when the user leaves it to the engine: on a backend that budgets memory (CUDA)
// the slots, the step's tokens and the context follow from the memory left after the weights, the way
// vLLM sizes its KV cache; elsewhere (CPU) the small fixed defaults.
#pragma once
#include <cstdint>
#include <string>

#include "seam/backend.h"

namespace cm::runtime {

// What the user asked for; 0 = choose.
struct SizingRequest {
  int32_t max_seqs = 0;
  int32_t max_step_tokens = 0;
  int64_t ctx = 0;
  int64_t model_ctx = 4096;  // the model's max_position_embeddings
};

struct Sizing {
  CacheShape shape;
  std::string why;  // for the start-up line: what was chosen and from what
};

// CPU defaults, and the GPU's.
inline constexpr int32_t kCpuMaxSeqs = 8, kCpuMaxStepTokens = 256;
inline constexpr int64_t kCpuCtx = 4096;
inline constexpr int32_t kGpuMaxSeqs = 256, kGpuMaxStepTokens = 2048;
inline constexpr int64_t kGpuCtx = 32768, kGpuMinCtx = 4096;

// On a budgeting backend: max_step_tokens 2048, the context min(model, 32768) halved (not below 4096
// or the model's) until one slot fits, and as many slots as fit, at most 256; what the user set is kept
// (and a set value that does not fit is left for reserve() to refuse by name).
Sizing size_reservation(const ModelBackend& be, const SizingRequest& r);

}  // namespace cm::runtime
