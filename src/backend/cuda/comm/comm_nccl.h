// NcclComm: the Comm (engine/comm.h) of one process per GPU, over NCCL.
// Built only when CMake finds NCCL in a CUDA build (CLAWMINE_HAVE_NCCL).
//
// Buffers are device pointers; every collective is enqueued on the comm's own
// stream and the call returns when it has completed. Waiting polls the stream
// and ncclCommGetAsyncError: an NCCL error, or no completion within the
// timeout (a peer rank died or hangs), aborts the communicator and throws a
// cm::Error naming this rank, the collective and the cause — never a hang.
// Sums are NCCL's (ring/tree order, not rank order); the expert-parallel MoE
// uses only data movement (all-to-all, all-gather), which is exact.
#pragma once
#include <memory>
#include <string>

#include "comm/comm.h"

namespace cm {

struct NcclOptions {
  double timeout_s = 300;  // per collective (and for init): past it the rank gives up with an error
};

// The 128-byte ncclUniqueId rank 0 makes and hands to every rank (by the launcher).
std::string nccl_unique_id();

// Joins rank `rank` of `size` on the current CUDA device.
std::unique_ptr<Comm> make_nccl_comm(int rank, int size, const std::string& unique_id, const NcclOptions& opt = {});

}  // namespace cm
