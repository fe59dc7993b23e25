// broadcast_batch (batch_broadcast.h): a header [rows, status] from rank 0, then the
// rows packed as int32 [token | pos | slot | logits + 2·undo] from rank 0, each through
// all_gatherv with counts {k, 0, …, 0}, so every rank receives rank 0's block.
#include "factory/batch_broadcast.h"

#include <string>

#include "common/error.h"

namespace cm {

namespace {

// Rank 0's check of its own plan: empty when it can be sent.
std::string plan_error(const OwnedBatch& p) {
  const size_t n = p.token.size();
  if (!p.undo.empty() && p.undo.size() != n)
    return "the plan's undo flags (" + std::to_string(p.undo.size()) + ") are not one per row (" + std::to_string(n) + ")";
  if (p.pos.size() != n || p.slot.size() != n || p.logits.size() != n)
    return "the plan's token, pos, slot and logits lengths differ (" + std::to_string(n) + ", " +
           std::to_string(p.pos.size()) + ", " + std::to_string(p.slot.size()) + ", " +
           std::to_string(p.logits.size()) + ")";
  if (n > size_t(kMaxBroadcastRows))
    return "the plan has " + std::to_string(n) + " rows, more than " + std::to_string(kMaxBroadcastRows);
  return {};
}

}  // namespace

void broadcast_from_rank0(Comm& comm, const int32_t* send, int64_t k, int32_t* recv) {
  std::vector<int64_t> counts(size_t(comm.size()), 0);
  counts[0] = k;
  comm.all_gatherv(send, counts.data(), recv);
}

OwnedBatch broadcast_batch(Comm& comm, const OwnedBatch& plan) {
  const bool root = comm.rank() == 0;
  const std::string err = root ? plan_error(plan) : std::string();
  int32_t head[2] = {root && err.empty() ? plan.rows() : 0, err.empty() ? 1 : 0};
  int32_t got[2] = {0, 0};
  broadcast_from_rank0(comm, head, 2, got);
  if (got[1] != 1) {
    if (root) fail("broadcast_batch: {}", err);
    fail("broadcast_batch: rank 0 could not send its step plan (it reports the cause)");
  }
  if (got[0] < 0 || got[0] > kMaxBroadcastRows)
    fail("broadcast_batch: rank 0 announced {} rows (0 to {} allowed)", got[0], kMaxBroadcastRows);
  const int64_t n = got[0];
  OwnedBatch out;
  if (n == 0) return out;  // every rank knows n: all skip the rows' collective together
  std::vector<int32_t> rows(size_t(4 * n));
  if (root) {
    for (int64_t i = 0; i < n; ++i) {
      rows[size_t(i)] = plan.token[size_t(i)];
      rows[size_t(n + i)] = plan.pos[size_t(i)];
      rows[size_t(2 * n + i)] = plan.slot[size_t(i)];
      rows[size_t(3 * n + i)] = (plan.logits[size_t(i)] ? 1 : 0) | (!plan.undo.empty() && plan.undo[size_t(i)] ? 2 : 0);
    }
  }
  std::vector<int32_t> recv(size_t(4 * n));
  broadcast_from_rank0(comm, rows.data(), 4 * n, recv.data());
  out.token.assign(recv.begin(), recv.begin() + n);
  out.pos.assign(recv.begin() + n, recv.begin() + 2 * n);
  out.slot.assign(recv.begin() + 2 * n, recv.begin() + 3 * n);
  out.logits.resize(size_t(n));
  bool any_undo = false;
  for (int64_t i = 0; i < n; ++i) {
    out.logits[size_t(i)] = (recv[size_t(3 * n + i)] & 1) != 0;
    any_undo = any_undo || (recv[size_t(3 * n + i)] & 2) != 0;
  }
  if (any_undo) {
    out.undo.resize(size_t(n));
    for (int64_t i = 0; i < n; ++i) out.undo[size_t(i)] = (recv[size_t(3 * n + i)] & 2) != 0;
  }
  return out;
}

}  // namespace cm
