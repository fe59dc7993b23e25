// `clawmine plan -m DIR --gpus N [--gpu-memory-gib G] [--gpu-memory-utilization U] [--ctx C ...]`
// The memory plan of a config over N GPUs with expert parallelism (backend/memory_plan.h): weights
// and working buffers per GPU, and how many sequences of each context fit. Reads config.json only.
#include <cstdio>
#include <memory>

#include "backend/memory_plan.h"
#include "cli/commands.h"
#include "model/config.h"

namespace {

struct Opts {
  std::string dir;
  cm::PlanInput in;
};

int run(const Opts& o) {
  const cm::Config c = cm::config_load(o.dir);
  const cm::MemoryPlan p = cm::plan_memory(c, o.in);
  const std::string s = cm::plan_text(c, o.in, p);
  std::fwrite(s.data(), 1, s.size(), stdout);
  return 0;
}

cm::cli::CommandRegistrar reg({"plan", "Memory plan of a model over N GPUs: weights, buffers and sequences per GPU",
                               [](CLI::App& app) -> cm::cli::CommandRun {
                                 auto o = std::make_shared<Opts>();
                                 app.add_option("-m,--model", o->dir, "Model directory (its config.json)")
                                     ->required();
                                 app.add_option("--gpus", o->in.gpus, "GPUs (expert-parallel ranks)");
                                 app.add_option("--gpu-memory-gib", o->in.gpu_gib, "Memory per GPU in GiB");
                                 app.add_option("--gpu-memory-utilization", o->in.utilization,
                                                "Share of each GPU's memory the engine may use");
                                 app.add_option("--max-step-tokens", o->in.max_step_tokens,
                                                "Tokens per step the working buffers are sized for");
                                 app.add_option("--ctx", o->in.contexts, "Contexts to report (repeatable)");
                                 return [o] { return run(*o); };
                               }});

}  // namespace
