// The step plan and the checks both backends share (step_plan.h).
#include "backend/step_plan.h"

#include <algorithm>

#include "common/error.h"
#include "model/config.h"
#include "ops/sample.h"

namespace cm {

void StepPlan::reserve(const CacheShape& shape) {
  segs.assign(size_t(std::max(shape.max_slots, 1)), Segment{});
  seg_of_row.assign(size_t(std::max(shape.max_step_tokens, 1)), 0);
  logit_rows.assign(size_t(std::max(shape.max_step_tokens, 1)), 0);
  n = n_segs = n_logits = max_pos = 0;
}

void StepPlan::build(const Batch& b) {
  n = b.n;
  n_segs = n_logits = max_pos = 0;
  for (int64_t t = 0; t < n; ++t) {
    if (t == 0 || b.slot[t] != b.slot[t - 1])
      segs[size_t(n_segs++)] = Segment{b.slot[t], int32_t(t), 0, b.pos[t], b.undo && b.undo[t]};
    segs[size_t(n_segs - 1)].n++;
    seg_of_row[size_t(t)] = int32_t(n_segs - 1);
    if (b.logits[t]) logit_rows[size_t(n_logits++)] = int32_t(t);
    max_pos = std::max<int64_t>(max_pos, b.pos[t]);
  }
}

void check_reserve(const CacheShape& shape, const Config& c) {
  if (shape.max_slots < 1) fail("reserve: max_slots must be >= 1 (got {})", shape.max_slots);
  if (shape.max_step_tokens < 1) fail("reserve: max_step_tokens must be >= 1 (got {})", shape.max_step_tokens);
  if (shape.max_ctx < 1 || shape.max_ctx > c.max_position_embeddings)
    fail("reserve: context {} outside [1, {}] (the model's max_position_embeddings)", shape.max_ctx,
         c.max_position_embeddings);
}

StateLayout make_state_layout(const Config& c, int64_t slots, int64_t max_ctx, size_t kv_elem_bytes, bool mtp) {
  StateLayout l;
  l.slots = slots;
  l.layers.assign(size_t(c.num_layers), LayerStateLayout{});
  auto add = [&](StateTensor::Kind kind, int64_t layer, bool indexer, int64_t rows, int64_t width, size_t elem) {
    StateTensor t;
    t.kind = kind, t.layer = layer, t.indexer = indexer, t.rows = rows, t.width = width, t.elem_bytes = elem;
    t.offset = (l.bytes + 255) / 256 * 256;
    l.bytes = t.offset + t.slot_bytes() * size_t(slots);
    l.bytes_per_slot += t.slot_bytes();
    l.tensors.push_back(t);
    return int32_t(l.tensors.size() - 1);
  };
  auto compressor = [&](int64_t L, bool indexer, int64_t m, int64_t cc, int64_t dc) {
    CompressorLayout cl;
    cl.ratio = m, cl.c = cc, cl.dc = dc, cl.max_entries = std::max<int64_t>(1, max_ctx / m);
    cl.pend_kv = add(StateTensor::PEND_KV, L, indexer, cc * m, cc * dc, 4);
    cl.pend_gate = add(StateTensor::PEND_GATE, L, indexer, cc * m, cc * dc, 4);
    cl.entries = add(StateTensor::ENTRIES, L, indexer, cl.max_entries, dc, kv_elem_bytes);
    return cl;
  };
  for (int64_t L = 0; L < c.num_layers; ++L) {
    LayerStateLayout& ll = l.layers[size_t(L)];
    ll.window_rows = c.sliding_window;
    ll.window = add(StateTensor::WINDOW, L, false, c.sliding_window, c.head_dim, kv_elem_bytes);
    const AttnKind k = c.attn_kinds[size_t(L)];
    if (k == AttnKind::SLIDING) continue;
    ll.comp = compressor(L, false, c.ratio(L), k == AttnKind::CSA ? 2 : 1, c.head_dim);
    if (k == AttnKind::CSA) ll.index = compressor(L, true, c.ratio(L), 2, c.index_head_dim);
  }
  if (mtp) {
    int64_t ring = c.sliding_window;
    for (const StateTensor& t : l.tensors)
      if (t.kind != StateTensor::ENTRIES) ring = std::min(ring, t.rows);
    LayerStateLayout ll;
    ll.window_rows = c.sliding_window;
    ll.lag = 1;
    ll.window = add(StateTensor::WINDOW, c.num_layers, false, c.sliding_window, c.head_dim, kv_elem_bytes);
    l.layers.push_back(ll);
    l.hidden = add(StateTensor::HIDDEN, c.num_layers, false, ring + 1, c.hc_mult * c.hidden_size, 4);
  }
  l.bytes = std::max<size_t>(l.bytes, 4);
  return l;
}

void check_draft(const DraftRequest& r, const CacheShape& shape, int64_t V, const int64_t* slot_pos) {
  const int64_t n = r.n, k = r.k;
  if (shape.max_slots < 1) fail("draft: the backend has no reserved slots (call reserve first)");
  if (k < 1 || k > kMaxDraft) fail("draft: {} drafts per slot outside [1, {}]", k, kMaxDraft);
  if (n < 1 || n > std::min<int64_t>(shape.max_slots, shape.max_step_tokens))
    fail("draft: {} slots outside [1, {}] (the reserved slots and step tokens)", n,
         std::min<int64_t>(shape.max_slots, shape.max_step_tokens));
  if (!r.slot || !r.token || !r.out) fail("draft: slot, token and out are required");
  for (int64_t i = 0; i < n; ++i) {
    const int32_t s = r.slot[i];
    if (s < 0 || s >= shape.max_slots) fail("draft: slot {} outside [0, {})", s, shape.max_slots);
    for (int64_t j = 0; j < i; ++j)
      if (r.slot[j] == s) fail("draft: slot {} appears twice", s);
    if (slot_pos[s] < 1) fail("draft: slot {} holds no token to draft from", s);
    if (slot_pos[s] - 1 + k > shape.max_ctx)
      fail("draft: slot {}: {} drafts from position {} pass the reserved context of {}", s, k, slot_pos[s],
           shape.max_ctx);
    if (r.token[i] < 0 || r.token[i] >= V) fail("draft: slot {}: token {} outside [0, {})", s, r.token[i], V);
    if (r.params) check_sample_params(r.params[i]);
  }
}

void check_batch(const Batch& b, const CacheShape& shape, int64_t vocab, const int64_t* slot_pos) {
  if (shape.max_slots < 1) fail("step: the backend has not been reserved (call reserve first)");
  if (b.n < 1) fail("step: empty batch");
  if (b.n > shape.max_step_tokens)
    fail("step: {} tokens exceed the reserved max_step_tokens of {}", b.n, shape.max_step_tokens);
  if (!b.token || !b.pos || !b.slot || !b.logits) fail("step: batch arrays missing");
  int32_t prev_slot = -1;
  int64_t expect = 0;
  for (int32_t i = 0; i < b.n; ++i) {
    const int32_t s = b.slot[i];
    if (s < 0 || s >= shape.max_slots) fail("step: row {}: slot {} outside the reserved [0, {})", i, s, shape.max_slots);
    if (b.token[i] < 0 || b.token[i] >= vocab)
      fail("step: row {}: token id {} is outside the vocabulary [0, {})", i, b.token[i], vocab);
    if (s != prev_slot) {
      for (int32_t j = 0; j < i; ++j)
        if (b.slot[j] == s) fail("step: slot {}'s tokens are not contiguous in the batch (rows {} and {})", s, j, i);
      expect = slot_pos[s];
      prev_slot = s;
    } else if (b.undo && (b.undo[i] != 0) != (b.undo[i - 1] != 0)) {
      fail("step: slot {}: rows {} and {} of its run disagree on undo (a run keeps an undo log or not)", s, i - 1, i);
    }
    if (b.pos[i] != expect)
      fail("step: row {}: position {} does not continue slot {} (expected {})", i, b.pos[i], s, expect);
    if (b.pos[i] >= shape.max_ctx)
      fail("step: slot {}: position {} is past the reserved context of {} tokens", s, b.pos[i], shape.max_ctx);
    ++expect;
  }
}

}  // namespace cm
