// A step's batch, made by rank 0 and shipped to every rank of a group.
//
// Multi-GPU serving runs one process per GPU: rank 0 runs the HTTP server and
// the scheduler, and every rank must run the same steps (the MoE layers'
// collectives pair up step by step). So before each step rank 0 broadcasts the
// batch it built — tokens, positions, slots, which rows want logits — and every
// rank steps its own backend with it. The broadcast is two all_gatherv calls in
// which only rank 0 contributes (a header with the row count, then the rows), so
// it works over any Comm (threads in CI, NCCL on GPUs: there the buffers must be
// device memory, so a caller stages them).
#pragma once
#include <cstdint>
#include <vector>

#include "seam/backend.h"
#include "comm/comm.h"

namespace cm {

struct OwnedBatch {
  std::vector<int32_t> token, pos, slot;  // one per row
  std::vector<uint8_t> logits;            // 1 = the row's logits are wanted
  std::vector<uint8_t> undo;              // Batch::undo (empty: none)
  int32_t rows() const { return int32_t(token.size()); }
  Batch batch() const {
    Batch b{rows(), token.data(), pos.data(), slot.data(), logits.data()};
    if (!undo.empty()) b.undo = undo.data();
    return b;
  }
};

// Collective: rank 0's k int32 values (send; ignored elsewhere) in recv[k] on every rank (an
// all_gatherv in which only rank 0 contributes). The batch broadcast and LeaderBackend's commands use it.
void broadcast_from_rank0(Comm& comm, const int32_t* send, int64_t k, int32_t* recv);

// The largest batch a broadcast carries (rows); a bigger one is refused.
inline constexpr int32_t kMaxBroadcastRows = int32_t(1) << 24;

// Collective (every rank calls it, in the same order as its other collectives):
// returns rank 0's `batch` on every rank; the other ranks' `batch` is not read.
// A batch of 0 rows is legal (a server's "no more steps"). A malformed batch on
// rank 0 (vectors of different lengths, too many rows) makes every rank throw
// the same error, rank 0 naming the problem and the others naming rank 0; no
// rank is left waiting.
OwnedBatch broadcast_batch(Comm& comm, const OwnedBatch& batch);

}  // namespace cm
