// Rolling a slot back (ModelBackend::rollback_slot; speculative decoding): which rows of a slot's
// state a run of tokens writes, and the book of their previous contents, the same for both backends.
//
// A step writes, per layer, the window row of each position (p mod W), each compressor's pending rows
// (p mod c·m) and the entry a position completes (entry (p+1)/m − 1 when (p+1) mod m = 0). Nothing else:
// a slot's only counter is its position. So to undo the positions [r, end) it is enough to put back
// what those rows held before the log opened, provided no row was written twice since then: the span
// of a log (end − start) is at most the smallest ring (token_limit(), 8 for CSA's 2·4-row rings). The
// book only computes copies (state offset, log offset, bytes); each backend makes them in its memory
// (the CPU with memcpy, CUDA with one kernel per step), so both undo the same rows.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "backend/step_plan.h"

namespace cm {

// One row between the state buffer and a slot's log (byte offsets from each buffer's start).
struct UndoCopy {
  size_t state_off = 0;
  size_t log_off = 0;
  uint32_t bytes = 0;
};

class UndoBook {
 public:
  // For `layout` (all slots); drops every log.
  void reserve(const StateLayout& layout);
  // The longest span a log can undo (tokens since it opened): the smallest ring of the layout.
  int64_t token_limit() const { return limit_; }
  // A slot's share of the log buffer (the buffer holds slots × this bytes).
  size_t log_bytes_per_slot() const { return slot_bytes_; }
  // The most copies one slot's log holds (a step's saves are at most slots × this).
  int64_t max_copies_per_slot() const { return slot_copies_; }
  // Before a step changes anything: every undoable run's span (its slot's open log's start, else its
  // position, to the end of the run) must be within token_limit(). Throws naming the slot.
  void check(const StepPlan& plan) const;
  // Books a checked step: appends the rows each undoable run writes to its slot's log (opening it at
  // the run's first position) and returns the copies state → log to make before the step writes
  // anything; the other runs close their slots' logs (nothing to copy).
  void book_step(const StepPlan& plan, std::vector<UndoCopy>& saves);
  // The copies log → state that return `slot` (now at position `cur`) to position `pos`, and closes its
  // log. pos must lie in [the log's start, cur]; pos == cur with no log is a no-op. Throws otherwise,
  // naming the slot and the range.
  void book_rollback(int32_t slot, int64_t pos, int64_t cur, std::vector<UndoCopy>& restores);
  void drop(int32_t slot);  // reset_slot, copy_slot's target, reserve
  bool open(int32_t slot) const { return slots_[size_t(slot)].start >= 0; }

 private:
  struct Rec {
    UndoCopy copy;
    int64_t pos = 0;  // the position that writes the row
  };
  struct Slot {
    int64_t start = -1;  // first position of the log (-1: closed)
    int64_t end = 0;     // one past the last position booked
    std::vector<Rec> recs;
    size_t used = 0;     // bytes of the slot's log in use
  };
  StateLayout layout_;
  int64_t limit_ = 0;
  size_t slot_bytes_ = 0;
  int64_t slot_copies_ = 0;
  std::vector<Slot> slots_;
};

}  // namespace cm
