// plan_memory (memory_plan.h).
#include "backend/memory_plan.h"

#include <fmt/format.h>

#include <algorithm>

#include "backend/step_plan.h"
#include "common/error.h"
#include "comm/comm.h"
#include "model/dummy.h"

namespace cm {

namespace {

constexpr double kGiB = double(size_t(1) << 30);

// One routed expert of one layer: w1, w3 [I, D] and w2 [D, I] in NVFP4 (half a byte a weight, an E4M3
// scale per 16).
double expert_bytes(const Config& c) {
  return 3.0 * double(c.hidden_size) * double(c.moe_inter) * (0.5 + 1.0 / 16);
}

size_t working_bytes(const Config& c, int64_t n) {
  const double D = double(c.hidden_size), I = double(c.moe_inter), K = double(c.n_experts_per_tok);
  const double hc = double(std::max<int64_t>(c.hc_mult, 1)), N = double(n);
  const double moe = N * K * (2 * I + 4 * D + 8) + N * 2 * D;  // the MoE scratch (cuda_reserve)
  const double streams = 8 * N * hc * D * 4;                     // residual streams and their mixes
  const double logits = N * double(c.vocab_size) * 4;           // a logits row per token at most
  return size_t(moe + streams + logits) + (size_t(320) << 20);   // attention split workspace, runtime spare
}

}  // namespace

MemoryPlan plan_memory(const Config& c, const PlanInput& in) {
  if (in.gpus < 1 || in.gpus > 1024) fail("plan: --gpus {} (1 to 1,024)", in.gpus);
  if (!(in.gpu_gib > 0 && in.gpu_gib < 1e6)) fail("plan: --gpu-memory-gib {} (a positive size in GiB)", in.gpu_gib);
  if (!(in.utilization > 0 && in.utilization <= 1))
    fail("plan: --gpu-memory-utilization {} (in (0, 1])", in.utilization);
  if (in.max_step_tokens < 1) fail("plan: --max-step-tokens {} (at least 1)", in.max_step_tokens);
  const int64_t E = c.n_routed_experts, layers = c.num_layers;
  MemoryPlan p;
  p.gpus = in.gpus;
  const double routed_total = expert_bytes(c) * double(E) * double(layers);
  p.replicated = size_t(std::max(0.0, double(dummy_host_bytes(c)) - routed_total));
  auto share = [&](int g) { return expert_first(E, 1, g) - expert_first(E, 0, g); };  // rank 0's, the largest
  p.experts_per_gpu = share(in.gpus);
  p.routed_per_gpu = size_t(expert_bytes(c) * double(p.experts_per_gpu) * double(layers));
  p.weights_per_gpu = p.routed_per_gpu + p.replicated;
  p.working = working_bytes(c, in.max_step_tokens);
  p.budget = size_t(in.gpu_gib * in.utilization * kGiB);
  for (int g = 1; g <= 1024 && p.min_gpus == 0; ++g)
    if (size_t(expert_bytes(c) * double(share(g)) * double(layers)) + p.replicated + p.working < p.budget)
      p.min_gpus = g;
  std::vector<int64_t> ctxs = in.contexts;
  if (ctxs.empty())
    for (int64_t x : {int64_t(4096), int64_t(32768), int64_t(131072), int64_t(1) << 20})
      if (x <= c.max_position_embeddings) ctxs.push_back(x);
  const size_t used = p.weights_per_gpu + p.working;
  for (int64_t ctx : ctxs) {
    if (ctx < 1 || ctx > c.max_position_embeddings)
      fail("plan: context {} outside [1, {}] (the config's max_position_embeddings)", ctx, c.max_position_embeddings);
    PlanRow r;
    r.ctx = ctx;
    r.state_per_slot = make_state_layout(c, 1, ctx, 2).bytes_per_slot;
    r.max_seqs = used < p.budget && r.state_per_slot > 0 ? int64_t((p.budget - used) / r.state_per_slot) : 0;
    p.rows.push_back(r);
  }
  return p;
}

std::string plan_text(const Config& c, const PlanInput& in, const MemoryPlan& p) {
  auto gib = [](size_t b) { return fmt::format("{:.2f} GiB", double(b) / kGiB); };
  std::string s = fmt::format(
      "{} layers, {} routed experts (top-{}), hidden {}, on {} GPU{} of {:.1f} GiB at utilization {:.2f} "
      "(budget {} each)\n",
      c.num_layers, c.n_routed_experts, c.n_experts_per_tok, c.hidden_size, p.gpus, p.gpus == 1 ? "" : "s",
      in.gpu_gib, in.utilization, gib(p.budget));
  s += fmt::format("weights per GPU: routed experts {} of {} ({}), replicated (attention, shared expert, router, "
                   "embedding, head) {}; total {}\n",
                   p.experts_per_gpu, c.n_routed_experts, gib(p.routed_per_gpu), gib(p.replicated),
                   gib(p.weights_per_gpu));
  s += fmt::format("working buffers per GPU (estimate, {}-token steps): {}\n", in.max_step_tokens, gib(p.working));
  if (p.weights_per_gpu + p.working >= p.budget) {
    s += fmt::format("does not fit: weights and buffers need {} per GPU; ",
                     gib(p.weights_per_gpu + p.working));
    s += p.min_gpus ? fmt::format("at least {} GPUs of this size\n", p.min_gpus) : "no GPU count up to 1,024 fits\n";
    return s;
  }
  s += fmt::format("left for sequence state per GPU: {}\n", gib(p.budget - p.weights_per_gpu - p.working));
  s += fmt::format("{:>10}  {:>14}  {:>13}\n", "context", "state per seq", "max sequences");
  for (const PlanRow& r : p.rows)
    s += fmt::format("{:>10}  {:>10.1f} MiB  {:>13}\n", r.ctx, double(r.state_per_slot) / double(1 << 20),
                     r.max_seqs);
  s += "every GPU holds every sequence's state (attention runs replicated); weights counted as NVFP4 experts, "
       "FP8 attention and shared expert, BF16 router, compressors, embedding and head\n";
  return s;
}

}  // namespace cm
