// runtime::size_reservation on the CUDA backend (the server's GPU defaults): the shape it picks for the
// default model is one reserve() accepts, within the budget the backend reports, and a step runs on it.
#include <gtest/gtest.h>

#include <vector>

#include "factory/factory.h"
#include "gpu_test_util.h"
#include "model/model.h"
#include "runtime/sizing.h"

using namespace cm;

TEST(SizingCuda, TheChosenShapeReservesAndRuns) {
  CM_SKIP_WITHOUT_GPU();
  auto m = model_load(std::string(CLAWMINE_TEST_DATA) + "/../../models/default");
  auto be = make_backend(*m, Device::CUDA);
  const size_t budget = be->reserve_budget();
  ASSERT_NE(budget, SIZE_MAX);
  ASSERT_GT(budget, size_t(1) << 30);  // the default model leaves most of the GPU
  const runtime::Sizing s =
      runtime::size_reservation(*be, runtime::SizingRequest{0, 0, 0, m->config.max_position_embeddings});
  std::printf("  %s\n", s.why.c_str());
  EXPECT_EQ(s.shape.max_slots, runtime::kGpuMaxSeqs);  // a small model: the cap, not the memory
  EXPECT_EQ(s.shape.max_ctx, std::min<int64_t>(m->config.max_position_embeddings, runtime::kGpuCtx));
  EXPECT_LE(be->reserve_bytes(s.shape), budget);
  be->reserve(s.shape);
  // Bytes grow with slots and context as the reservation's parts do.
  CacheShape more = s.shape;
  more.max_slots *= 2;
  EXPECT_GT(be->reserve_bytes(more), be->reserve_bytes(s.shape));
  // A step on the last slot.
  const int32_t tok[2] = {5, 9}, pos[2] = {0, 1}, slot[2] = {s.shape.max_slots - 1, s.shape.max_slots - 1};
  const uint8_t want[2] = {0, 1};
  Batch b{2, tok, pos, slot, want};
  std::vector<float> logits(size_t(m->config.vocab_size));
  be->step(b, logits.data());
  EXPECT_EQ(be->slot_pos(s.shape.max_slots - 1), 2);
}
