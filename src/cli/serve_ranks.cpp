// start_ranks / follow (serve_ranks.h).
#include "cli/serve_ranks.h"

#include <cstdio>

#include "common/error.h"
#include "factory/leader_backend.h"
#include "model/config.h"
#ifdef CLAWMINE_HAVE_NCCL
#include "backend/cuda/comm/comm_nccl.h"
#include "backend/cuda/cuda_backend.h"
#endif

namespace cm::cli {

ServeRanks::~ServeRanks() {
  comm.reset();
  if (!children.empty()) {
    const int code = wait_ranks(children);
    if (code) std::fprintf(stderr, "clawmine serve: a rank exited with status %d\n", code);
  }
}

std::unique_ptr<ServeRanks> start_ranks(EngineOptions& o, int gpus, const LaunchOptions& l) {
  RankEnv e = rank_env(gpus, l);
  if (!e.distributed) return nullptr;
#ifndef CLAWMINE_HAVE_NCCL
  fail("--gpus / a launcher's RANK and WORLD_SIZE: this clawmine was built without NCCL (configure with "
       "-DCLAWMINE_NCCL=ON in a CUDA build)");
#else
  if (resolved_device(o) != Device::CUDA) fail("--gpus {}: expert parallelism over GPUs needs --device cuda", e.world);
  if (o.load_format == "dummy")
    fail("--gpus with --load-format dummy: the dummy weights are made whole on one GPU; serve a checkpoint");
  if (o.mtp > 0) fail("--gpus with --mtp: MTP with expert parallelism is not supported yet");
  if (!cuda_backend_available()) fail("--gpus {}: no CUDA device here", e.world);
  auto r = std::make_unique<ServeRanks>();
  r->env = e;
  const std::string made = e.rank == 0 ? nccl_unique_id() : std::string(128, '\0');
  if (e.spawned_here) r->children = spawn_ranks(e, made);
  const std::string id = share_nccl_id(e, made);
  o.cuda_device = e.local_rank;
  cuda_use_device(e.local_rank);  // NCCL joins the current device
  const Config c = config_load(resolve_model(o.model, o.model_flag));
  const int64_t E = c.n_routed_experts;
  if (E < e.world) fail("--gpus {}: the model has only {} routed experts", e.world, E);
  o.experts = ExpertRange{expert_first(E, e.rank, e.world),
                          expert_first(E, e.rank + 1, e.world) - expert_first(E, e.rank, e.world)};
  std::fprintf(stderr, "clawmine serve: rank %d of %d on GPU %d, routed experts [%lld, %lld) of %lld\n", e.rank,
               e.world, e.local_rank, (long long)o.experts.first, (long long)(o.experts.first + o.experts.count),
               (long long)E);
  r->comm = make_nccl_comm(e.rank, e.world, id);
  o.ep_comm = r->comm.get();
  return r;
#endif
}

int follow(ServeRanks& r, EngineOptions& o) {
  auto model = load_model(o);
  std::unique_ptr<ModelBackend> be = unreserved_backend(o, *model, nullptr);
  run_follower(*be, *r.comm, model->config.vocab_size);
  std::fprintf(stderr, "clawmine serve: rank %d done\n", r.env.rank);
  return 0;
}

}  // namespace cm::cli
