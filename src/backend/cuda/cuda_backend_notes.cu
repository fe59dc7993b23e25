// The named intermediates of a CUDA step ("l<L>.s<slot>.<what>", the CPU backend's names): note() queues
// a buffer for the per-row non-finite count (flush_counts counts the queued ones in one launch) and hands
// its rows to the observer (--layer-stats, device_observer.h); first_non_finite names the first that went
// non-finite when the logits do.
#include "backend/cuda/cuda_backend_impl.h"

#include "backend/cuda/core/cuda_errors.h"

namespace cm {

// Queues the intermediate for counting its non-finite values per row (flush_counts); with an observer, hands
// each slot's rows over as "l<L>.s<slot>.<what>" (device_observer.h).
void CudaBackend::note(const char* what, int64_t layer, const void* data, bool bf16, int64_t width,
                       const std::vector<int64_t>& inner) {
  if (notes_.size() < max_notes_) {
    // Counted later, together (flush_counts): the buffer must stay unchanged until the next flush.
    cuda::NonFiniteBatch& b = pending_counts_;
    b.x[b.count] = data;
    b.width[b.count] = width;
    b.bf16[b.count] = bf16;
    b.out[b.count] = P<int32_t>(act_.counts) + int64_t(notes_.size()) * shape_.max_step_tokens;
    ++b.count;
    notes_.push_back(NoteTag{what, layer});
    if (b.count == cuda::NonFiniteBatch::kMax) flush_counts();
  }
  if (!obs_.active()) return;
  std::vector<int64_t> shape{0};
  shape.insert(shape.end(), inner.begin(), inner.end());
  const size_t esize = bf16 ? 2 : 4;
  for (const Segment& s : plan_) {
    shape[0] = s.n;
    obs_.observe(*ctx_, note_name(what, layer, s.slot),
                 static_cast<const char*>(data) + size_t(s.row0 * width) * esize, bf16, shape);
  }
}

// Counts the non-finite values of the intermediates noted since the last flush, in one launch. The
// step flushes before it overwrites a noted buffer: after the embedding, after each layer (the two
// halves write their own buffers; the next layer rewrites them) and when the batch is full.
void CudaBackend::flush_counts() {
  if (pending_counts_.count == 0) return;
  cuda::OpScope op(*ctx_, "count_non_finite");
  cuda::count_non_finite(*ctx_, pending_counts_, n_);
  pending_counts_.count = 0;
}

// Observer only: per segment, the entries (and CSA index keys) this step completed, as the CPU names them.
void CudaBackend::observe_entries(int64_t L, const CompressorStateView& comp, const CompressorStateView* index) {
  if (!obs_.active()) return;
  for (const Segment& s : plan_) {
    for (const CompressorStateView* st : {&comp, index}) {
      if (!st) continue;
      const int64_t first = s.pos0 / st->ratio, n_new = (s.pos0 + s.n) / st->ratio - first;
      if (n_new <= 0) continue;
      obs_.observe(*ctx_, note_name(st == index ? "index_keys" : "entries", L, s.slot),
                   st->entries + (int64_t(s.slot) * st->max_entries + first) * st->dc, true, {n_new, st->dc});
    }
  }
}

// The first counted intermediate with a non-finite value, named for the slot of its first bad row.
std::string CudaBackend::first_non_finite() {
  const int64_t N = shape_.max_step_tokens;
  std::vector<int32_t> counts(notes_.size() * size_t(N));
  obs_.to_host(*ctx_, counts.data(), act_.counts.get(), counts.size() * 4);
  for (size_t i = 0; i < notes_.size(); ++i)
    for (const Segment& s : plan_)
      for (int64_t r = s.row0; r < s.row0 + s.n; ++r)
        if (counts[i * size_t(N) + size_t(r)] > 0)
          return note_name(notes_[i].what, notes_[i].layer, s.slot);
  return "the LM head";
}

}  // namespace cm
