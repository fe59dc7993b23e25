// The multi-GPU launch of `serve` (expert parallelism, one process per GPU).
//
//   clawmine serve --gpus N ...          this process is rank 0 on GPU 0; it starts ranks 1..N-1 (this
//                                        binary, the same arguments) on GPUs 1..N-1 and hands them the
//                                        NCCL id through their environment.
//   torchrun (or mpirun/srun exporting the same variables) ...
//                                        every process takes its rank from --rank/--world-size/
//                                        --local-rank, whose env mirrors are the launcher's RANK,
//                                        WORLD_SIZE and LOCAL_RANK, and rank 0 serves the NCCL id to the
//                                        others on --master-addr:--master-port+1 (MASTER_ADDR, MASTER_PORT).
// Rank 0 loads its share of the routed experts, runs the scheduler and the HTTP server over a
// LeaderBackend; every other rank loads its share and follows (run_follower) until rank 0 ends.
#pragma once
#include <CLI/CLI.hpp>
#include <string>
#include <sys/types.h>
#include <vector>

namespace cm::cli {

// The launcher's view of this process (flags; each with its launcher's variable as env mirror).
struct LaunchOptions {
  int rank = -1, world_size = -1, local_rank = -1;  // --rank RANK, --world-size WORLD_SIZE, --local-rank LOCAL_RANK
  std::string master_addr;                          // --master-addr MASTER_ADDR
  int master_port = -1;                             // --master-port MASTER_PORT
  std::string nccl_id;                              // --nccl-id CLAWMINE_NCCL_ID (hex; set for spawned ranks)
};
void add_launch_options(CLI::App& app, LaunchOptions& o);

struct RankEnv {
  bool distributed = false;  // --gpus given, or a launcher's variables present
  bool spawned_here = false; // rank 0 of `--gpus N`: it starts the others
  int rank = 0, world = 1, local_rank = 0;
  std::string master_addr;   // --master-addr (launchers; empty with --gpus)
  int master_port = 0;       // --master-port
  std::string nccl_id_hex;   // --nccl-id (set by rank 0 for the ranks it spawns)
};

// This process's place (gpus: --gpus, 0 when not given). Fails naming a rank outside the world,
// incomplete rank flags, or --gpus that disagrees with the launcher's world size.
RankEnv rank_env(int gpus, const LaunchOptions& l);

// Rank 0: the NCCL unique id (128 bytes), made here; the others: read from --nccl-id, or from
// rank 0 over MASTER_ADDR:MASTER_PORT (waiting up to timeout_s for it to listen). Rank 0 under a
// launcher serves it to world-1 connections in a background thread.
std::string share_nccl_id(const RankEnv& e, const std::string& made_id, double timeout_s = 300);

// Rank 0 of --gpus N: starts ranks 1..N-1 as this binary with this process's arguments and RANK,
// WORLD_SIZE, LOCAL_RANK and CLAWMINE_NCCL_ID in their environment; returns their pids.
std::vector<pid_t> spawn_ranks(const RankEnv& e, const std::string& nccl_id);
// Waits for spawned ranks; returns the first nonzero exit status (0 when all ended cleanly).
int wait_ranks(const std::vector<pid_t>& pids);

std::string to_hex(const std::string& bytes);
std::string from_hex(const std::string& hex, const char* what);

}  // namespace cm::cli
