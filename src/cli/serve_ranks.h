// serve over several GPUs (expert parallelism, one process per GPU; launch.h says how ranks start).
// start_ranks runs before the model loads: it finds this process's rank, selects its GPU, starts the
// other ranks (--gpus N) or joins the launcher's, makes the NCCL communicator and points the engine
// options at this rank's share of the routed experts. Rank 0 then serves over a LeaderBackend; the
// others call follow() and return when rank 0 ends.
#pragma once
#include <memory>
#include <sys/types.h>
#include <vector>

#include "cli/engine_options.h"
#include "cli/launch.h"
#include "comm/comm.h"

namespace cm::cli {

struct ServeRanks {
  RankEnv env;
  std::unique_ptr<Comm> comm;
  std::vector<pid_t> children;  // ranks this process started (--gpus N)
  ~ServeRanks();                // reaps the children (after the leader has told them to end)
};

// Null when serve runs on one GPU without NCCL (no --gpus, no launcher variables). Fails naming the
// reason when this build has no NCCL, the device is not CUDA, or the weights are dummy ones.
std::unique_ptr<ServeRanks> start_ranks(EngineOptions& o, int gpus, const LaunchOptions& l);

// A rank other than 0: repeats rank 0's calls on its backend until rank 0 ends. Returns the exit code.
int follow(ServeRanks& r, EngineOptions& o);

}  // namespace cm::cli
