// --load-format dummy on the GPU (bench/bench_model.h's make_dummy_cuda_backend): the shipped V4-Flash
// config with its first 4 layers (two window-only, a CSA and an HCA layer) generated on the device, sized
// by runtime::size_reservation as the server sizes it, prefills and decodes with finite logits.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "bench/bench_model.h"
#include "gpu_test_util.h"
#include "model/dummy.h"
#include "runtime/sizing.h"

using namespace cm;

TEST(DummyCuda, FlashLayersOnTheDevice) {
  CM_SKIP_WITHOUT_GPU();
  const Config c = keep_first_layers(config_load(std::string(CLAWMINE_TEST_DATA) + "/../../models/v4-flash"), 4);
  auto m = dummy_model(c, false);
  auto be = cuda::make_dummy_cuda_backend(*m, BackendOptions{}, false);
  const runtime::Sizing s = runtime::size_reservation(*be, runtime::SizingRequest{0, 0, 0, c.max_position_embeddings});
  std::printf("  V4-Flash, 4 layers: %s\n", s.why.c_str());
  EXPECT_EQ(s.shape.max_ctx, runtime::kGpuCtx);
  EXPECT_GE(s.shape.max_slots, 8);
  be->reserve(s.shape);
  // A 40-token prompt in slot 0, then three decode steps of slots 0 and 1 (a copy).
  std::vector<int32_t> tok(40), pos(40), slot(40, 0);
  std::vector<uint8_t> want(40, 0);
  for (int i = 0; i < 40; ++i) tok[size_t(i)] = (i * 7919 + 11) % 129280, pos[size_t(i)] = i;
  want.back() = 1;
  std::vector<float> logits(size_t(2 * c.vocab_size));
  be->step(Batch{40, tok.data(), pos.data(), slot.data(), want.data()}, logits.data());
  be->copy_slot(0, 1);
  for (int t = 0; t < 3; ++t) {
    const int32_t tk[2] = {100 + t, 200 + t}, ps[2] = {40 + t, 40 + t}, sl[2] = {0, 1};
    const uint8_t w[2] = {1, 1};
    be->step(Batch{2, tk, ps, sl, w}, logits.data());
    for (float v : logits) ASSERT_TRUE(std::isfinite(v));
  }
  EXPECT_EQ(be->slot_pos(1), 43);
}
