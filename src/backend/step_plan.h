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
  bool undo = false; // the run keeps an undo log (Batch::undo)
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

// Per-slot state, described once for both backends (the CPU keeps window rows and entries in f32,
// the CUDA backend in bf16; everything else is the same). Per layer:
//   window    [W, hd]                     the last W KV rows, row of position p at p mod W;
//   CSA/HCA layers, the compressor (c = 2 for CSA's overlapping blocks, 1 for HCA; m = its ratio):
//   pend_kv   [c·m, c·dc] f32             the projected rows of the last c·m positions, row of
//   pend_gate [c·m, c·dc] f32             position p at p mod c·m (raw gates: ape is added when a
//                                         block is pooled) — the open block and, for CSA, the
//                                         previous block whose A halves the next entry pools;
//   entries   [max(1, max_ctx/m), dc]     entry e (normed, RoPE'd at e·m) once position (e+1)·m − 1
//                                         has been processed;
//   CSA layers also the lightning indexer's own compressor (c = 2, dc = index_head_dim): its keys.
// No counters: a slot's entry count is pos / m and its open block pos mod m. Each tensor holds all
// slots' rows one after the other ([slots, rows, width]), so copy_slot copies one piece per tensor.
struct StateTensor {
  enum Kind : uint8_t { WINDOW, PEND_KV, PEND_GATE, ENTRIES, HIDDEN };
  Kind kind = WINDOW;
  int64_t layer = 0;
  bool indexer = false;       // the CSA indexer's compressor (else the attention's)
  int64_t rows = 0, width = 0;
  size_t elem_bytes = 4;
  size_t offset = 0;          // bytes from the state buffer's start to slot 0's rows
  size_t slot_bytes() const { return size_t(rows * width) * elem_bytes; }
  size_t slot_offset(int64_t slot) const { return offset + size_t(slot) * slot_bytes(); }
};

// One compressor's shape and where its tensors are (indices into StateLayout::tensors).
struct CompressorLayout {
  int64_t ratio = 0, c = 0, dc = 0, max_entries = 0;  // m; 2 = CSA, 1 = HCA; entry width
  int32_t pend_kv = -1, pend_gate = -1, entries = -1;
  bool present() const { return ratio > 0; }
};

struct LayerStateLayout {
  int32_t window = -1;
  int64_t window_rows = 0;  // W
  // The MTP block's layer (after the model's layers) lags one position: its row of position t is
  // written by the step that feeds token t + 1 (it embeds the token after t).
  int64_t lag = 0;
  CompressorLayout comp;    // CSA/HCA layers
  CompressorLayout index;   // CSA layers
};

struct StateLayout {
  std::vector<StateTensor> tensors;  // in buffer order
  std::vector<LayerStateLayout> layers;  // the model's layers, then the MTP block's (if any)
  // With an MTP block: the last block's output streams of the slot's last positions, f32
  // [hidden_rows, hc·D], row of position p at p mod hidden_rows (one more row than the smallest other
  // ring, so an undoable run never overwrites the row before it); the MTP block reads them.
  int32_t hidden = -1;
  int64_t slots = 0;
  size_t bytes = 0;           // the whole buffer (every tensor's start aligned to 256 bytes)
  size_t bytes_per_slot = 0;  // one slot's share (without the alignment)

  template <typename T>
  T* at(void* base, int32_t tensor, int64_t slot) const {
    return reinterpret_cast<T*>(static_cast<char*>(base) + tensors[size_t(tensor)].slot_offset(slot));
  }
};

// The layout for `slots` slots of max_ctx tokens; kv_elem_bytes: the size of a window row's and an
// entry's elements (4: f32, 2: bf16). mtp: with the first MTP block's window and the hidden ring.
StateLayout make_state_layout(const Config& c, int64_t slots, int64_t max_ctx, size_t kv_elem_bytes, bool mtp = false);

// Checks a batch against the reserved shape and the slots' positions before any state changes
// (slot_pos[s]: the tokens slot s holds). Throws naming the row, the slot and the limit.
void check_batch(const Batch& b, const CacheShape& shape, int64_t vocab, const int64_t* slot_pos);

// The logits rows sample_last_step takes (ModelBackend::max_sample_rows): one per slot; with an MTP
// block, a verify run's 1 + kMaxDraft rows per slot, at most a step's tokens.
inline int64_t sample_rows_for(const CacheShape& shape, bool mtp) {
  const int64_t spec = int64_t(shape.max_slots) * (1 + kMaxDraft);
  return mtp ? (spec < shape.max_step_tokens ? spec : int64_t(shape.max_step_tokens)) : shape.max_slots;
}

// draft()'s checks, the same in every backend (after its own: a block to draft with): k in [1, kMaxDraft],
// distinct reserved slots that hold a token, drafts inside the context, tokens in the vocabulary,
// sampling parameters in range. Throws naming the slot and the limit.
void check_draft(const DraftRequest& r, const CacheShape& shape, int64_t vocab, const int64_t* slot_pos);

}  // namespace cm
