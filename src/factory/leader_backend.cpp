// LeaderBackend and run_follower (rank_backend.h). A command is four int32
// values [kind, a, b, c] from rank 0; a step's batch follows through
// broadcast_batch. reserve's max_ctx travels as two int32 halves.
#include "factory/leader_backend.h"

#include <cstdio>
#include <vector>

#include "common/error.h"
#include "factory/batch_broadcast.h"

namespace cm {

namespace {

enum Kind : int32_t { kStop = 0, kReserve = 1, kReset = 2, kCopy = 3, kStep = 4, kRollback = 5, kKeepalive = 6 };
struct Command {
  int32_t v[5] = {0, 0, 0, 0, 0};  // kind, a, b, c, d
};

// Collective: rank 0's command on every rank.
Command exchange(Comm& comm, const Command& mine) {
  Command got;
  broadcast_from_rank0(comm, mine.v, 5, got.v);
  return got;
}

Command reserve_command(const CacheShape& s) {
  Command c;
  const uint64_t ctx = uint64_t(s.max_ctx);
  c.v[0] = kReserve;
  c.v[1] = s.max_slots;
  c.v[2] = s.max_step_tokens;
  c.v[3] = int32_t(uint32_t(ctx & 0xffffffffu));
  c.v[4] = int32_t(uint32_t(ctx >> 32));
  return c;
}

CacheShape reserved_shape(const Command& c) {
  CacheShape s;
  s.max_slots = c.v[1];
  s.max_step_tokens = c.v[2];
  s.max_ctx = int64_t(uint64_t(uint32_t(c.v[3])) | (uint64_t(uint32_t(c.v[4])) << 32));
  return s;
}

}  // namespace

LeaderBackend::LeaderBackend(ModelBackend& local, Comm& comm) : local_(local), comm_(comm) {
  if (comm.rank() != 0) fail("LeaderBackend: made on rank {}; only rank 0 leads (the others run run_follower)", comm.rank());
}

LeaderBackend::~LeaderBackend() {
  try {
    exchange(comm_, Command{});  // kStop
  } catch (const std::exception& e) {
    std::fprintf(stderr, "clawmine: could not stop the follower ranks: %s\n", e.what());
  }
}

void LeaderBackend::reserve(const CacheShape& shape) {
  exchange(comm_, reserve_command(shape));
  local_.reserve(shape);
}

void LeaderBackend::keepalive() {
  Command c;
  c.v[0] = kKeepalive;
  exchange(comm_, c);
}

void LeaderBackend::reset_slot(int32_t slot) {
  Command c;
  c.v[0] = kReset;
  c.v[1] = slot;
  exchange(comm_, c);
  local_.reset_slot(slot);
}

void LeaderBackend::copy_slot(int32_t from, int32_t to) {
  Command c;
  c.v[0] = kCopy;
  c.v[1] = from;
  c.v[2] = to;
  exchange(comm_, c);
  local_.copy_slot(from, to);
}

void LeaderBackend::rollback_slot(int32_t slot, int64_t pos) {
  Command c;
  const uint64_t p = uint64_t(pos);
  c.v[0] = kRollback;
  c.v[1] = slot;
  c.v[2] = int32_t(uint32_t(p & 0xffffffffu));
  c.v[3] = int32_t(uint32_t(p >> 32));
  exchange(comm_, c);
  local_.rollback_slot(slot, pos);
}

void LeaderBackend::step(const Batch& b, float* logits_out) {
  if (b.n < 0 || (b.n > 0 && (!b.token || !b.pos || !b.slot || !b.logits)))
    fail("step: a batch of {} rows without its arrays", b.n);  // before any rank is told
  Command c;
  c.v[0] = kStep;
  exchange(comm_, c);
  OwnedBatch p;
  p.token.assign(b.token, b.token + b.n);
  p.pos.assign(b.pos, b.pos + b.n);
  p.slot.assign(b.slot, b.slot + b.n);
  p.logits.assign(b.logits, b.logits + b.n);
  if (b.undo) p.undo.assign(b.undo, b.undo + b.n);
  broadcast_batch(comm_, p);
  local_.step(b, logits_out);
}

void run_follower(ModelBackend& local, Comm& comm, int64_t vocab) {
  if (comm.rank() == 0) fail("run_follower: called on rank 0 (rank 0 leads through LeaderBackend)");
  std::vector<float> logits;
  for (;;) {
    const Command c = exchange(comm, Command{});
    try {
      switch (c.v[0]) {
        case kStop: return;
        case kKeepalive: break;
        case kReserve: local.reserve(reserved_shape(c)); break;
        case kReset: local.reset_slot(c.v[1]); break;
        case kCopy: local.copy_slot(c.v[1], c.v[2]); break;
        case kRollback:
          local.rollback_slot(c.v[1], int64_t(uint64_t(uint32_t(c.v[2])) | (uint64_t(uint32_t(c.v[3])) << 32)));
          break;
        case kStep: {
          const OwnedBatch p = broadcast_batch(comm, OwnedBatch{});
          int64_t want = 0;
          for (uint8_t w : p.logits) want += w != 0;
          logits.resize(size_t(want * vocab));
          local.step(p.batch(), logits.data());
          break;
        }
        default: fail("run_follower: rank 0 sent an unknown command {}", c.v[0]);
      }
    } catch (const Error&) {
      if (c.v[0] < kReserve || c.v[0] > kRollback) throw;  // the stream of commands is broken
      // The same call failed on rank 0 (same checks, same data), whose caller gets the error; this
      // rank goes on. If instead the group broke (a rank gone), the next exchange throws.
    }
  }
}

}  // namespace cm
