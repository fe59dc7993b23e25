// The multi-GPU launch of `serve` (expert parallelism, one process per GPU).
//
//   clawmine serve --gpus N ...          this process is rank 0 on GPU 0; it starts ranks 1..N-1 (this
//                                        binary, the same arguments) on GPUs 1..N-1 and hands them the
//                                        NCCL id through their environment.
//   torchrun / mpirun / srun ...         every process reads its rank from the launcher's variables
//                                        (RANK, WORLD_SIZE, LOCAL_RANK; OMPI_COMM_WORLD_*; SLURM_PROCID,
//                                        SLURM_NTASKS, SLURM_LOCALID) and rank 0 serves the NCCL id to the
//                                        others on MASTER_ADDR:MASTER_PORT (TCP).
// Rank 0 loads its share of the routed experts, runs the scheduler and the HTTP server over a
// LeaderBackend; every other rank loads its share and follows (run_follower) until rank 0 ends.
#pragma once
#include <string>
#include <sys/types.h>
#include <vector>

namespace cm::cli {

struct RankEnv {
  bool distributed = false;  // --gpus given, or a launcher's variables present
  bool spawned_here = false; // rank 0 of `--gpus N`: it starts the others
  int rank = 0, world = 1, local_rank = 0;
  std::string master_addr;   // MASTER_ADDR (launchers; empty with --gpus)
  int master_port = 0;       // MASTER_PORT
  std::string nccl_id_hex;   // CLAWMINE_NCCL_ID (set by rank 0 for the ranks it spawns)
};

// This process's place (gpus: --gpus, 0 when not given). Fails naming a variable that is malformed,
// a rank outside the world, or --gpus that disagrees with the launcher's WORLD_SIZE.
RankEnv rank_env(int gpus);

// Rank 0: the NCCL unique id (128 bytes), made here; the others: read from CLAWMINE_NCCL_ID, or from
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
