// Grouped NVFP4 MoE for decode on Hopper (spec §7). For T tokens with top-k
// global expert ids and routing weights w_k, per routed expert:
//   h = silu(min(x.w1^T, L)) * clamp(x.w3^T, -L, L) * w_k   (fp32, then bf16)
//   y[t] += h . w2^T                                         (fp32)
// i.e. the routing weight is applied before w2, as the official code does.
// Four launches, no host synchronisation (CUDA-graph capturable): a routing
// kernel builds the per-expert token lists on the device, a fused gate/up +
// SwiGLU kernel and a down kernel run over the routed experts only, and a
// combine kernel sums each token's top-k rows in k order (no float atomics:
// the same inputs give the same bits).
// Experts [first, first+count) live on this device; ids outside contribute nothing.
// Prefill (T >= kMoePrefillMinTokens) swaps the gate/up and down kernels for
// tiled ones that read each expert's weights once per 64 routed tokens
// instead of once per 16 (wgmma, sm90_nvfp4_moe_wgmma.cu; mma.sync,
// sm90_nvfp4_moe.cu); they compute every output element with the same
// operation sequence as the decode kernels, so a token's bits do not depend
// on the path or on the batch.
#pragma once
#include <cstdint>
#include <vector>

#include "backend/cuda/core/cuda_util.h"
#include "ops/linear.h"

namespace cm::cuda {

struct DeviceExperts {
  int64_t hidden = 0, inter = 0;
  int first = 0, count = 0;
  float swiglu_limit = 10.0f;
  // Packed (nvfp4_pack.h) weights, expert-major: w1/w3 [count][inter x hidden], w2 [count][hidden x inter].
  DeviceBuffer w1, s1, w3, s3, w2, s2;
  DeviceBuffer scale2;  // f32 [count][3]: scale_2 of w1, w3, w2
  size_t expert_bytes() const { return (w1.size() + s1.size() + w3.size() + s3.size() + w2.size() + s2.size()) / count; }
};

// gate[i], up[i], down[i] are expert first+i (NVFP4, [inter, hidden] / [hidden, inter]).
DeviceExperts upload_experts(const std::vector<const LinearWeight*>& gate, const std::vector<const LinearWeight*>& up,
                             const std::vector<const LinearWeight*>& down, int first, float swiglu_limit);
DeviceExperts random_experts(int64_t hidden, int64_t inter, int first, int count, uint64_t seed);

// Device scratch for up to max_tokens tokens with top-k routing
// (max_tokens·topk·(2·inter + 4·hidden + 8) + max_tokens·2·hidden bytes, the
// expert lists and the prefill tile list: at most max_tiles (expert, first row) pairs).
struct MoeScratch {
  int max_tokens = 0, topk = 0, max_tiles = 0;
  DeviceBuffer offsets, active, sorted_tok, sorted_w, h, yk, tiles;
  DeviceBuffer xq;  // bf16 [max_tokens, hidden]: x in the decode k order (the wgmma prefill)
  MoeScratch(const DeviceExperts& e, int max_tokens, int topk);
};

// Steps of at least this many tokens take the prefill kernels. A speed choice
// only (both paths give the same bits). The prefill kernels cost about one
// 64-token tile of mma per routed expert whatever its token count, the decode
// kernels about one weight read per 16 tokens: for V4-Flash (256 experts,
// top-6) the estimate puts the crossover near 512 tokens (12 per expert);
// `clawmine bench kernels --only moe` times both paths to tune it.
inline constexpr int kMoePrefillMinTokens = 512;

// Which kernels run: automatic picks by T (above); tests force one path to
// compare them bit for bit. prefill: the wgmma kernels (sm90_nvfp4_moe_wgmma.cu) where they take the
// experts, else the mma.sync ones; prefill_mma: the mma.sync prefill kernels.
enum class MoePath { automatic, decode, prefill, prefill_mma };

// Expert parallelism: every rank runs the same T tokens with its own experts [first, first+count);
// each rank's yk rows of the other ranks' experts are set to +0, all_reduce_sum(ctx, yk, n) enqueues
// the ranks' sum of yk on ctx's stream (one owner per row: the sum is that owner's row exactly), and
// the combine then adds every k in k order, the very sums one rank holding every expert does.
struct MoeExchange {
  void* ctx;
  void (*all_reduce_sum)(void* ctx, float* yk, int64_t n);
};

// x: bf16 [T, hidden]; ids: int32 [T, topk] global expert ids; weights: f32 [T, topk];
// y: f32 [T, hidden] (overwritten). All device pointers. exchange: null on one rank.
void moe_nvfp4(Context& ctx, const DeviceExperts& e, MoeScratch& s, const uint16_t* x, int T, const int32_t* ids,
               const float* weights, float* y, MoePath path = MoePath::automatic,
               const MoeExchange* exchange = nullptr);

}  // namespace cm::cuda
