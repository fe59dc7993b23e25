// TEMPORARY: see dev_backend.h.
#include "serve/dev_backend.h"

#include <cstring>

#include "common/error.h"
#include "model/model.h"

namespace cm::serve {
namespace {
class ForwardBackend : public ModelBackend {
 public:
  explicit ForwardBackend(const Model& m) : m_(m) {}
  Device device() const override { return Device::CPU; }
  void reserve(const CacheShape& s) override {
    shape_ = s;
    st_.clear();
    for (int i = 0; i < s.max_slots; ++i) st_.push_back(state_new(m_.config));
  }
  const CacheShape& shape() const override { return shape_; }
  size_t bytes_per_slot(const CacheShape&) const override { return 0; }
  int64_t slot_pos(int32_t s) const override { return st_.at(size_t(s)).pos; }
  void reset_slot(int32_t s) override { state_reset(st_.at(size_t(s))); }
  void copy_slot(int32_t f, int32_t t) override { st_.at(size_t(t)) = st_.at(size_t(f)); }
  void step(const Batch& b, float* out) override {
    const int64_t V = m_.config.vocab_size;
    CM_CHECK(b.n <= shape_.max_step_tokens, "step of {} tokens > max_step_tokens", b.n);
    int32_t i = 0;
    size_t row = 0;
    while (i < b.n) {
      int32_t j = i;
      while (j < b.n && b.slot[j] == b.slot[i]) ++j;
      State& st = st_.at(size_t(b.slot[i]));
      CM_CHECK(b.pos[i] == st.pos, "slot {}: pos {} but the slot holds {}", b.slot[i], b.pos[i], st.pos);
      ForwardOptions fo;
      fo.all_logits = true;
      std::vector<float> lg = forward(m_, st, b.token + i, j - i, fo);
      for (int32_t k = i; k < j; ++k)
        if (b.logits[k]) std::memcpy(out + (row++) * size_t(V), lg.data() + size_t(k - i) * size_t(V), sizeof(float) * size_t(V));
      i = j;
    }
  }

 private:
  const Model& m_;
  CacheShape shape_;
  std::vector<State> st_;
};
}  // namespace
std::unique_ptr<ModelBackend> make_forward_backend(const Model& m) { return std::make_unique<ForwardBackend>(m); }
}  // namespace cm::serve
