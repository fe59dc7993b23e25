// What both backends share about a step and a reservation, so that they read a batch, check a
// shape and lay out per-slot state the same way (the seam, seam/backend.h, says what a step is;
// this says how a backend takes it apart).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "seam/backend.h"

namespace cm {

struct Config;

// A run of one slot's tokens inside a step's batch.
struct Segment {
  int32_t slot = 0;
  int32_t row0 = 0;  // first batch row
  int32_t n = 0;     // rows
  int64_t pos0 = 0;  // position of the first row
};

// A batch taken apart once per step: its slot runs, each row's run, the rows whose logits are
// wanted and the largest position. reserve() sizes it for a CacheShape; build() allocates nothing.
struct StepPlan {
  std::vector<Segment> segs;        // [max_slots] (the first n_segs used)
  std::vector<int32_t> seg_of_row;  // [max_step_tokens]
  std::vector<int32_t> logit_rows;  // [max_step_tokens]: batch rows with logits[i] = 1, in order
  int64_t n = 0, n_segs = 0, n_logits = 0, max_pos = 0;

  void reserve(const CacheShape& shape);
  // The batch must have passed check_batch.
  void build(const Batch& b);
  const Segment* begin() const { return segs.data(); }
  const Segment* end() const { return segs.data() + n_segs; }
};

// reserve()'s checks, the same in every backend: at least one slot and one token per step, a
// context in [1, the model's max_position_embeddings]. Throws naming the field.
void check_reserve(const CacheShape& shape, const Config& c);

// Checks a batch against the reserved shape and the slots' positions before any state changes
// (slot_pos[s]: the tokens slot s holds). Throws naming the row, the slot and the limit.
void check_batch(const Batch& b, const CacheShape& shape, int64_t vocab, const int64_t* slot_pos);

}  // namespace cm
