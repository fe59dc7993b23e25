// Serving over many ranks with one scheduler.
//
// Rank 0 runs the scheduler (and, when serving, the HTTP server) against a
// LeaderBackend: a ModelBackend that forwards every call that changes state
// (reserve, reset_slot, copy_slot, step) to the other ranks before running it on
// its own backend. Every other rank runs run_follower, which repeats those calls
// on its backend in the same order until the leader is destroyed. The ranks' own
// backends share the step's collectives (expert parallelism: BackendOptions::
// ep_comm), so they must run exactly the same calls — which this guarantees
// without any rank but 0 knowing about requests.
//
// The ranks run the same batch (replicated attention, BackendOptions::ep_data_parallel false); the
// data-parallel mode, where each rank steps its own sequences, needs a plan per rank and is not
// served this way yet.
//
// A call that fails does so on every rank alike (the backends check the same
// arguments in the same way), so the leader throws it to its caller and the
// followers drop it and wait for the next call. Commands travel as small int32
// messages through all_gatherv from rank 0 (step batches through broadcast_batch).
#pragma once
#include <cstdint>
#include <memory>

#include "seam/backend.h"
#include "comm/comm.h"

namespace cm {

class LeaderBackend final : public ModelBackend {
 public:
  // `local` is rank 0's own backend; `comm` is the group (comm.rank() must be 0). Not owned.
  LeaderBackend(ModelBackend& local, Comm& comm);
  ~LeaderBackend() override;  // tells the followers to return
  Device device() const override { return local_.device(); }
  void reserve(const CacheShape& shape) override;
  const CacheShape& shape() const override { return local_.shape(); }
  size_t bytes_per_slot(const CacheShape& shape) const override { return local_.bytes_per_slot(shape); }
  int64_t slot_pos(int32_t slot) const override { return local_.slot_pos(slot); }
  void reset_slot(int32_t slot) override;
  void copy_slot(int32_t from, int32_t to) override;
  void step(const Batch& batch, float* logits_out) override;
  int64_t undo_token_limit() const override { return local_.undo_token_limit(); }
  void rollback_slot(int32_t slot, int64_t pos) override;
  std::vector<uint8_t> slot_state(int32_t slot) const override { return local_.slot_state(slot); }
  // Sampling is rank 0's alone (no collective): the followers computed the same logits and drop them.
  bool samples_on_device() const override { return local_.samples_on_device(); }
  void sample_last_step(const StepSampling& s) override { local_.sample_last_step(s); }
  // Tells the followers the leader is alive: an idle scheduler calls it more often than the
  // Comm's timeout (the followers' wait for the next call is a collective and times out).
  void keepalive();

 private:
  ModelBackend& local_;
  Comm& comm_;
};

// On every rank but 0: repeats the leader's calls on `local` (vocab: the model's, to size the logits
// it computes and drops) until the leader is destroyed; then returns. A call that fails here is
// dropped (it failed on rank 0 too, whose caller sees it). Collective failures (a rank gone, a
// timeout) are thrown.
void run_follower(ModelBackend& local, Comm& comm, int64_t vocab);

}  // namespace cm
