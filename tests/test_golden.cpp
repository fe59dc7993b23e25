// End-to-end golden tests: our CPU logits against transformers' fp32 logits
// for the fixtures made by tools/make_golden.py (random small DeepSeek-V4
// checkpoints covering window-only, CSA and HCA layers, hash routing, YaRN,
// both key and config spellings, BF16 weights and shards). Each fixture runs
// as one prefill and in chunks of 1 and 7 tokens. Bound: max |Δ| ≤ 1e-3 (the
// issue's bound; measured ≈ 4e-6, fp32 summation-order noise).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "io/safetensors.h"
#include "model/model.h"

using namespace cm;

namespace {

struct Golden {
  std::vector<int32_t> tokens;
  std::vector<float> logits;  // [T, V]
};

Golden read_golden(const std::string& dir) {
  SafetensorsFile f(dir + "/expected.safetensors");
  Golden g;
  const TensorView* t = f.find("tokens");
  const TensorView* l = f.find("logits");
  EXPECT_TRUE(t && l);
  for (int64_t i = 0; i < t->numel(); ++i) {
    int64_t v;
    std::memcpy(&v, t->data + 8 * i, 8);
    g.tokens.push_back(int32_t(v));
  }
  g.logits.assign(reinterpret_cast<const float*>(l->data), reinterpret_cast<const float*>(l->data) + l->numel());
  return g;
}

double run_chunks(const Model& m, const Golden& g, int64_t chunk) {
  State st = state_new(m.config);
  ForwardOptions fo;
  fo.all_logits = true;
  const int64_t T = int64_t(g.tokens.size()), V = m.config.vocab_size;
  if (chunk <= 0) chunk = T;
  double worst = 0;
  for (int64_t i = 0; i < T; i += chunk) {
    int64_t n = std::min(chunk, T - i);
    std::vector<float> l = forward(m, st, g.tokens.data() + i, n, fo);
    EXPECT_EQ(int64_t(l.size()), n * V);
    for (int64_t j = 0; j < n * V; ++j) {
      double d = std::fabs(double(l[size_t(j)]) - g.logits[size_t(i * V + j)]);
      if (!(d <= worst)) worst = d;  // NaN propagates as worst = NaN
    }
  }
  EXPECT_EQ(st.pos, T);
  return worst;
}

class GoldenTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenTest, MatchesTransformers) {
  const std::string dir = std::string(CLAWMINE_TEST_DATA) + "/golden/" + GetParam();
  auto m = model_load(dir);
  Golden g = read_golden(dir);
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
  Golden g = read_golden(dir);
  const int64_t T = int64_t(g.tokens.size()), V = m->config.vocab_size;
  State st = state_new(m->config);
  // A different sequence first, so stale state would show.
  std::vector<int32_t> other(23, 5);
  forward(*m, st, other.data(), int64_t(other.size()));
  state_reset(st);
  ForwardOptions fo;
  fo.all_logits = true;
  const int64_t sizes[] = {3, 1, 9, 4, 2, 13};
  int64_t i = 0, k = 0;
  double worst = 0;
  while (i < T) {
    int64_t n = std::min(sizes[k++ % 6], T - i);
    std::vector<float> l = forward(*m, st, g.tokens.data() + i, n, fo);
    for (int64_t j = 0; j < n * V; ++j) worst = std::max(worst, double(std::fabs(l[size_t(j)] - g.logits[size_t(i * V + j)])));
    i += n;
  }
  EXPECT_LE(worst, 1e-3);
  State st2 = state_new(m->config);
  std::vector<float> last = forward(*m, st2, g.tokens.data(), T);
  ASSERT_EQ(int64_t(last.size()), V);
  for (int64_t j = 0; j < V; ++j) EXPECT_NEAR(last[size_t(j)], g.logits[size_t((T - 1) * V + j)], 1e-3);
}

}  // namespace
