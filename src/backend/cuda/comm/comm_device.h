// DeviceComm: R ranks on this one GPU in one process (one thread and one CudaBackend each), for
// proving the multi-rank CUDA paths on a single GPU: the stream-ordered all-reduce the CUDA
// backend's expert parallelism uses runs as kernels on each rank's own stream, exchanging through
// device memory, so CUDA graphs capture it exactly as they would capture NCCL's.
//
// all_reduce_sum_on (in place, buf on this device, every rank the same n and type):
//   barrier   each rank publishes buf's address and arrives (a per-rank epoch counter in device
//             memory, so a replayed graph keeps counting), then waits for every rank;
//   reduce    rank r sums chunk r of every rank's buf in rank order (0, 1, …, R−1) into its own;
//   barrier   every chunk is summed;
//   gather    rank r copies chunk q from rank q's buf, for every q ≠ r;
//   barrier   no rank reuses its buf while a peer still reads it.
// Each chunk's sum is written only by its owner, which alone reads that chunk of its own buf in
// the reduce phase, so the in-place update is race-free. A rank that never arrives makes the
// others trap after timeout_s (the process's CUDA context is then lost): an error, never a hang.
// The host-synchronous collectives stage through host memory over a ThreadComm group.
#pragma once
#include <memory>
#include <vector>

#include "comm/comm.h"

namespace cm {

// make_device_comms(R)[r] is rank r's communicator; all of them use the current CUDA device.
std::vector<std::unique_ptr<Comm>> make_device_comms(int ranks, double timeout_s = 120);

}  // namespace cm
