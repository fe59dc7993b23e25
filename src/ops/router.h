// The MoE router (spec §7): from the gate logits l [T, E] (fp32),
//   s_e = sqrt(softplus(l_e))   (PyTorch softplus: l for l > 20)
//   score layers: experts = top-k of s + bias (ties: lower expert id first)
//   hash layers:  experts = tid2eid[token]
//   weights w_k = s_{e_k} / (Σ_j s_{e_j} + 1e-20) · routed_scaling
// Expert ids are global (0 … E−1) whatever device holds the experts.
#pragma once
#include <cstdint>

namespace cm {

struct RouterParams {
  int64_t experts = 0, topk = 0;
  float routed_scaling = 1.0f;
  const float* bias = nullptr;       // [experts], score-routed layers
  const int32_t* tid2eid = nullptr;  // [vocab, topk], hash-routed layers (bias unused)
  int64_t vocab = 0;
};

// idx [T, topk] int32, weights [T, topk] f32, in selection order.
void route_cpu(const RouterParams& p, const int32_t* tokens, const float* logits, int64_t T, int32_t* idx,
               float* weights);

// --- CUDA (src/backend/cuda/router.cu): the same, one warp per token; every
// pointer (params' bias/tid2eid too) is a device pointer. experts <= 1024,
// topk <= 32. Ids and weights match the CPU exactly when s matches. A NaN
// logit counts as -inf (the step reports the NaN; the arg-max still picks an
// expert id inside the row). ---
namespace cuda {
class Context;
}
void route_cuda(cuda::Context& ctx, const RouterParams& p, const int32_t* tokens, const float* logits, int64_t T,
                int32_t* idx, float* weights);

}  // namespace cm
