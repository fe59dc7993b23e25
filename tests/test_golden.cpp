// End-to-end golden tests: our CPU logits against transformers' fp32 logits
// for the fixtures made by tools/make_golden.py (random small DeepSeek-V4
// checkpoints covering window-only, CSA and HCA layers, hash routing, YaRN,
// both key and config spellings, BF16 weights and shards), through the CPU
// backend's step(). Each fixture runs as one prefill and in chunks of 1 and 7. Bound: max |Δ| ≤ 1e-3 (the
// issue's bound; measured ≈ 4e-6, fp32 summation-order noise).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "io/safetensors.h"
#include "model/model.h"
#include "step_util.h"

using namespace cm;

namespace {

double run_chunks(const Model& m, const test::Expected& g, int64_t chunk) {
  std::vector<float> l = test::cpu_logits(m, g.tokens, chunk);
  EXPECT_EQ(l.size(), g.logits.size());
  double worst = 0;
  for (size_t j = 0; j < std::min(l.size(), g.logits.size()); ++j) {
    double d = std::fabs(double(l[j]) - g.logits[j]);
    if (!(d <= worst)) worst = d;  // NaN propagates as worst = NaN
  }
  return worst;
}

class GoldenTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenTest, MatchesTransformers) {
  const std::string dir = std::string(CLAWMINE_TEST_DATA) + "/golden/" + GetParam();
  auto m = model_load(dir);
  test::Expected g = test::read_expected(dir);
  ASSERT_EQ(int64_t(g.logits.size()), int64_t(g.tokens.size()) * m->config.vocab_size);
  for (int64_t chunk : {int64_t(0), int64_t(1), int64_t(7)}) {
    double d = run_chunks(*m, g, chunk);
    RecordProperty("max_abs_diff_chunk_" + std::to_string(chunk), std::to_string(d));
    std::printf("  %s chunk %lld: max |logits - transformers| = %.3g\n", GetParam().c_str(), (long long)chunk, d);
    EXPECT_LE(d, 1e-3) << "chunk " << chunk;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GoldenTest,
                         ::testing::Values("hf_mixed_yarn", "release_real_ratios", "hf_hca_window", "hf_text"));

// Irregular chunk sizes, state reuse after reset, and last-token-only logits
// all give the same numbers as one prefill.
TEST(GoldenState, ResetAndIrregularChunks) {
  const std::string dir = std::string(CLAWMINE_TEST_DATA) + "/golden/hf_mixed_yarn";
  auto m = model_load(dir);
  test::Expected g = test::read_expected(dir);
  const int64_t T = int64_t(g.tokens.size()), V = m->config.vocab_size;
  auto be = test::reserved_backend(*m, Device::CPU, 1, 13, T);
  // A different sequence first, so stale state would show.
  std::vector<int32_t> other(13, 5);
  test::feed_chunks(*be, 0, other.data(), int64_t(other.size()), 0, V);
  be->reset_slot(0);
  const int64_t sizes[] = {3, 1, 9, 4, 2, 13};
  int64_t i = 0, k = 0;
  double worst = 0;
  while (i < T) {
    int64_t n = std::min(sizes[k++ % 6], T - i);
    std::vector<float> l = test::feed_chunks(*be, 0, g.tokens.data() + i, n, 0, V);
    for (int64_t j = 0; j < n * V; ++j) worst = std::max(worst, double(std::fabs(l[size_t(j)] - g.logits[size_t(i * V + j)])));
    i += n;
  }
  EXPECT_LE(worst, 1e-3);
  EXPECT_EQ(be->slot_pos(0), T);
  // Only the last row's logits asked for.
  be->reset_slot(0);
  std::vector<int32_t> pos(static_cast<size_t>(T)), slot(static_cast<size_t>(T), 0);
  std::vector<uint8_t> want(static_cast<size_t>(T), 0);
  for (int64_t t = 0; t < T; ++t) pos[size_t(t)] = int32_t(t);
  want[size_t(T - 1)] = 1;
  auto be2 = test::reserved_backend(*m, Device::CPU, 1, int32_t(T), T);
  std::vector<float> last(static_cast<size_t>(V));
  be2->step(Batch{int32_t(T), g.tokens.data(), pos.data(), slot.data(), want.data()}, last.data());
  for (int64_t j = 0; j < V; ++j) EXPECT_NEAR(last[size_t(j)], g.logits[size_t((T - 1) * V + j)], 1e-3);
}

}  // namespace
