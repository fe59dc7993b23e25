// The undo book (undo_log.h).
#include "backend/undo_log.h"

#include <algorithm>

#include "common/error.h"

namespace cm {

namespace {

// Calls f(tensor, row, pos) for every row of one slot's state that positions [pos0, pos0 + n) write.
template <typename F>
void for_each_write(const StateLayout& l, int64_t pos0, int64_t n, F&& f) {
  auto ring = [&](int32_t t, int64_t q) { f(t, q % l.tensors[size_t(t)].rows, q); };
  for (const LayerStateLayout& ll : l.layers) {
    for (int64_t q = std::max(pos0, ll.lag); q < pos0 + n; ++q) f(ll.window, (q - ll.lag) % ll.window_rows, q);
    for (const CompressorLayout* cl : {&ll.comp, &ll.index}) {
      if (!cl->present()) continue;
      for (int64_t q = pos0; q < pos0 + n; ++q) {
        ring(cl->pend_kv, q);
        ring(cl->pend_gate, q);
        const int64_t e = (q + 1) / cl->ratio - 1;
        if ((q + 1) % cl->ratio == 0 && e < l.tensors[size_t(cl->entries)].rows) f(cl->entries, e, q);
      }
    }
  }
  if (l.hidden >= 0)
    for (int64_t q = pos0; q < pos0 + n; ++q) ring(l.hidden, q);
}

size_t row_bytes(const StateTensor& t) { return size_t(t.width) * t.elem_bytes; }

}  // namespace

void UndoBook::reserve(const StateLayout& layout) {
  layout_ = layout;
  limit_ = INT64_MAX;
  for (const StateTensor& t : layout.tensors)
    if (t.kind != StateTensor::ENTRIES && t.kind != StateTensor::HIDDEN) limit_ = std::min(limit_, t.rows);
  if (limit_ == INT64_MAX) limit_ = 0;
  // A log of limit_ positions: every ring row once (window, pending rows, hidden rows), and the
  // entries those positions may complete (at most limit_ / m + 1 wherever the run starts).
  slot_bytes_ = 0, slot_copies_ = 0;
  auto add = [&](int32_t t, int64_t rows) {
    slot_bytes_ += size_t(rows) * row_bytes(layout_.tensors[size_t(t)]);
    slot_copies_ += rows;
  };
  for (const LayerStateLayout& ll : layout_.layers) {
    add(ll.window, limit_);
    for (const CompressorLayout* cl : {&ll.comp, &ll.index}) {
      if (!cl->present()) continue;
      add(cl->pend_kv, limit_);
      add(cl->pend_gate, limit_);
      add(cl->entries, limit_ / cl->ratio + 1);
    }
  }
  if (layout_.hidden >= 0) add(layout_.hidden, limit_);
  slots_.assign(size_t(layout.slots), Slot{});
}

void UndoBook::check(const StepPlan& plan) const {
  for (const Segment& s : plan) {
    if (!s.undo) continue;
    const Slot& sl = slots_[size_t(s.slot)];
    const int64_t start = sl.start >= 0 ? sl.start : s.pos0;
    if (s.pos0 + s.n - start > limit_)
      fail("step: slot {}: an undoable run of positions [{}, {}) is longer than the {} tokens a rollback can undo "
           "(the smallest ring of the model's state; roll the slot back or commit it first)",
           s.slot, start, s.pos0 + s.n, limit_);
  }
}

void UndoBook::book_step(const StepPlan& plan, std::vector<UndoCopy>& saves) {
  saves.clear();
  for (const Segment& s : plan) {
    Slot& sl = slots_[size_t(s.slot)];
    if (!s.undo) {
      drop(s.slot);
      continue;
    }
    if (sl.start < 0) sl.start = sl.end = s.pos0, sl.used = 0, sl.recs.clear();
    const size_t base = size_t(s.slot) * slot_bytes_;
    for_each_write(layout_, s.pos0, s.n, [&](int32_t t, int64_t row, int64_t q) {
      const StateTensor& st = layout_.tensors[size_t(t)];
      Rec r;
      r.copy.state_off = st.slot_offset(s.slot) + size_t(row) * row_bytes(st);
      r.copy.bytes = uint32_t(row_bytes(st));
      r.copy.log_off = base + sl.used;
      r.pos = q;
      CM_CHECK(sl.used + r.copy.bytes <= slot_bytes_, "undo log of slot {} overflows its {} bytes", s.slot, slot_bytes_);
      sl.used += r.copy.bytes;
      sl.recs.push_back(r);
      saves.push_back(r.copy);
    });
    sl.end = s.pos0 + s.n;
  }
}

void UndoBook::book_rollback(int32_t slot, int64_t pos, int64_t cur, std::vector<UndoCopy>& restores) {
  restores.clear();
  Slot& sl = slots_[size_t(slot)];
  if (sl.start < 0) {
    if (pos == cur) return;
    fail("rollback_slot: slot {} has no undoable step to roll back (it holds {} tokens; asked for {})", slot, cur, pos);
  }
  if (pos < sl.start || pos > cur)
    fail("rollback_slot: slot {}: position {} outside [{}, {}] (the positions its undoable steps wrote)", slot, pos,
         sl.start, cur);
  for (const Rec& r : sl.recs)
    if (r.pos >= pos) restores.push_back(r.copy);
  drop(slot);
}

void UndoBook::drop(int32_t slot) {
  Slot& sl = slots_[size_t(slot)];
  sl.start = -1, sl.end = 0, sl.used = 0;
  sl.recs.clear();
}

}  // namespace cm
