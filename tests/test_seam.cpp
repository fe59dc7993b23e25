// The engine seam on every device (the suite is tests/seam_suite.h) and the
// CPU-only seam checks: chunking is bit-exact, bytes_per_slot and reserve limits.
#include "seam_suite.h"

namespace seam_suite {

// Chunking does not change a row's bits on the CPU: one prefill, chunks of 1
// and chunks of 7 agree exactly (every op is per row or per slot state).
TEST(SeamCpu, ChunkingIsBitExact) {
  auto m = model_load(kData + "/golden/release_real_ratios");
  Expected e = read_expected(kData + "/golden/release_real_ratios");
  std::vector<float> a = test::cpu_logits(*m, e.tokens, 0), b = test::cpu_logits(*m, e.tokens, 1),
                     c = test::cpu_logits(*m, e.tokens, 7);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0) << max_abs(a, b);
  EXPECT_EQ(std::memcmp(a.data(), c.data(), a.size() * 4), 0) << max_abs(a, c);
}

TEST(SeamCpu, BytesPerSlotAndReserveLimits) {
  auto m = model_load(kData + "/golden/hf_mixed_yarn");
  auto be = make_backend(*m, Device::CPU);
  const size_t b1 = be->bytes_per_slot(CacheShape{1, 1, 64}), b2 = be->bytes_per_slot(CacheShape{1, 1, 128});
  EXPECT_GT(b1, 0u);
  EXPECT_GT(b2, b1);  // entries grow with the context
  EXPECT_THROW(be->reserve(CacheShape{0, 4, 64}), Error);
  EXPECT_THROW(be->reserve(CacheShape{1, 0, 64}), Error);
  EXPECT_THROW(be->reserve(CacheShape{1, 4, m->config.max_position_embeddings + 1}), Error);
  std::vector<float> out(size_t(m->config.vocab_size));
  const int32_t t[] = {1}, p[] = {0}, s[] = {0};
  const uint8_t w[] = {1};
  EXPECT_THROW(be->step(Batch{1, t, p, s, w}, out.data()), Error);  // not reserved
}

INSTANTIATE_TEST_SUITE_P(Devices, Seam, ::testing::Values(Device::CPU, Device::CUDA),
                         [](const ::testing::TestParamInfo<Device>& i) { return std::string(device_name(i.param)); });

}  // namespace seam_suite
