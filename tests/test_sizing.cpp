// runtime::size_reservation: the server's slots, step tokens and context when left to the engine, on a
// backend with a memory budget (a model of one: state bytes per slot and token, activations per step
// token) and on one without (the CPU's fixed defaults).
#include <gtest/gtest.h>

#include "runtime/sizing.h"

using namespace cm;
using namespace cm::runtime;

namespace {

// reserve_bytes = slots * ctx * per_token + step_tokens * per_step_token + fixed.
class BudgetBackend : public ModelBackend {
 public:
  size_t budget = 0, per_token = 1000, per_step_token = 50000, fixed = 1 << 20;
  Device device() const override { return Device::CUDA; }
  void reserve(const CacheShape& s) override { shape_ = s; }
  const CacheShape& shape() const override { return shape_; }
  size_t bytes_per_slot(const CacheShape& s) const override { return size_t(s.max_ctx) * per_token; }
  int64_t slot_pos(int32_t) const override { return 0; }
  void reset_slot(int32_t) override {}
  void copy_slot(int32_t, int32_t) override {}
  void step(const Batch&, float*) override {}
  size_t reserve_bytes(const CacheShape& s) const override {
    return size_t(s.max_slots) * bytes_per_slot(s) + size_t(s.max_step_tokens) * per_step_token + fixed;
  }
  size_t reserve_budget() const override { return budget; }

 private:
  CacheShape shape_;
};

size_t need(const BudgetBackend& be, int32_t slots, int32_t step, int64_t ctx) {
  return be.reserve_bytes(CacheShape{slots, step, ctx});
}

}  // namespace

TEST(Sizing, TheMostSlotsThatFitTheBudget) {
  BudgetBackend be;
  be.budget = need(be, 37, kGpuMaxStepTokens, kGpuCtx) + 5;  // 37 slots of 32K fit, 38 do not
  const Sizing s = size_reservation(be, SizingRequest{0, 0, 0, 1 << 20});
  EXPECT_EQ(s.shape.max_slots, 37);
  EXPECT_EQ(s.shape.max_step_tokens, kGpuMaxStepTokens);
  EXPECT_EQ(s.shape.max_ctx, kGpuCtx);
  EXPECT_LE(be.reserve_bytes(s.shape), be.budget);
  EXPECT_NE(s.why.find("37 slots of 32768 tokens"), std::string::npos) << s.why;
  // A large budget: capped at 256 slots; a model with a shorter context keeps its own.
  be.budget = size_t(1) << 50;
  const Sizing big = size_reservation(be, SizingRequest{0, 0, 0, 8192});
  EXPECT_EQ(big.shape.max_slots, kGpuMaxSeqs);
  EXPECT_EQ(big.shape.max_ctx, 8192);
}

TEST(Sizing, TheContextHalvesUntilASlotFits) {
  BudgetBackend be;
  be.budget = need(be, 1, kGpuMaxStepTokens, 8192) + 10;  // one slot of 8K fits, of 16K not
  const Sizing s = size_reservation(be, SizingRequest{0, 0, 0, 1 << 20});
  EXPECT_EQ(s.shape.max_ctx, 8192);
  EXPECT_EQ(s.shape.max_slots, 1);
  // Nothing fits even at the floor: one slot of 4K, left for reserve() to refuse by name.
  be.budget = 100;
  const Sizing none = size_reservation(be, SizingRequest{0, 0, 0, 1 << 20});
  EXPECT_EQ(none.shape.max_ctx, kGpuMinCtx);
  EXPECT_EQ(none.shape.max_slots, 1);
  EXPECT_GT(be.reserve_bytes(none.shape), be.budget);
}

TEST(Sizing, ValuesGivenAreKept) {
  BudgetBackend be;
  be.budget = need(be, 10, 512, 16384) + 1;
  // The step's tokens given: the slots follow from what is left (and never exceed the step's tokens).
  Sizing s = size_reservation(be, SizingRequest{0, 512, 16384, 1 << 20});
  EXPECT_EQ(s.shape.max_step_tokens, 512);
  EXPECT_EQ(s.shape.max_ctx, 16384);
  EXPECT_EQ(s.shape.max_slots, 10);
  EXPECT_NE(s.why.find("kept"), std::string::npos);
  s = size_reservation(be, SizingRequest{0, 4, 16384, 1 << 20});
  EXPECT_EQ(s.shape.max_slots, 4);
  // Slots given, context not: the context halves until they fit.
  s = size_reservation(be, SizingRequest{10, 512, 0, 1 << 20});
  EXPECT_EQ(s.shape.max_slots, 10);
  EXPECT_EQ(s.shape.max_ctx, 16384);
  // Everything given: kept as it is, even when it does not fit (reserve() refuses it by name).
  s = size_reservation(be, SizingRequest{100, 512, 65536, 1 << 20});
  EXPECT_EQ(s.shape.max_slots, 100);
  EXPECT_EQ(s.shape.max_ctx, 65536);
}

TEST(Sizing, WithoutABudgetTheCpuDefaults) {
  class Cpu : public BudgetBackend {
    size_t reserve_budget() const override { return SIZE_MAX; }
  } be;
  Sizing s = size_reservation(be, SizingRequest{0, 0, 0, 1 << 20});
  EXPECT_EQ(s.shape.max_slots, kCpuMaxSeqs);
  EXPECT_EQ(s.shape.max_step_tokens, kCpuMaxStepTokens);
  EXPECT_EQ(s.shape.max_ctx, kCpuCtx);
  EXPECT_TRUE(s.why.empty());
  s = size_reservation(be, SizingRequest{300, 0, 100, 1 << 20});  // steps hold at least one token per slot
  EXPECT_EQ(s.shape.max_slots, 300);
  EXPECT_EQ(s.shape.max_step_tokens, 300);
  EXPECT_EQ(s.shape.max_ctx, 100);
}
