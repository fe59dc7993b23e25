// The memory plan of a config over N GPUs with expert parallelism (`clawmine plan`): what each GPU
// holds and how many sequences of a given context fit, from config.json alone.
//
// Each GPU holds its share of the routed experts (E/N of them, the first ranks one more when N does
// not divide E) and a replica of everything else (attention, compressors and indexers, the shared
// expert, the router, the embedding and the head), and the state of every slot, because attention
// runs replicated (every rank steps the same batch). Weights are counted in the release formats the
// dummy loader uses (NVFP4 routed experts with an E4M3 scale per 16, FP8 attention and shared expert,
// BF16 router, compressors, embedding and head); a BF16 checkpoint is about 3.6x larger. The working
// buffers are an estimate for steps of max_step_tokens tokens (the MoE scratch, the residual streams
// and the logits rows), within tens of percent of what the CUDA backend reserves.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"

namespace cm {

struct PlanInput {
  int gpus = 1;
  double gpu_gib = 140.0;             // memory per GPU (an H200 reports about 140 GiB)
  double utilization = 0.90;          // the share the engine may use (--gpu-memory-utilization)
  int64_t max_step_tokens = 2048;     // the step size the working buffers are sized for
  std::vector<int64_t> contexts;      // the contexts to report (empty: 4K, 32K, 128K, 1M within the config)
};

struct PlanRow {
  int64_t ctx = 0;
  size_t state_per_slot = 0;  // bytes of one sequence's state at this context (bf16 cache)
  int64_t max_seqs = 0;       // sequences of this context that fit on every GPU (0: none)
};

struct MemoryPlan {
  int gpus = 1;
  int64_t experts_per_gpu = 0;      // the largest share (rank 0's)
  size_t routed_per_gpu = 0;        // bytes of that share
  size_t replicated = 0;            // bytes every GPU holds besides its experts
  size_t weights_per_gpu = 0;
  size_t working = 0;               // the working buffers' estimate
  size_t budget = 0;                // gpu_gib · utilization
  int64_t min_gpus = 0;             // the fewest GPUs whose weights and buffers fit (0: none up to 1,024)
  std::vector<PlanRow> rows;
};

// Fails naming the input when gpus, memory or utilization are out of range.
MemoryPlan plan_memory(const Config& c, const PlanInput& in);
std::string plan_text(const Config& c, const PlanInput& in, const MemoryPlan& p);

}  // namespace cm
