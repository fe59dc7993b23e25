// The FP8 KV cache on the CPU backend (--kv-cache-dtype fp8, ops/kv_quant.h): the rounding itself on fresh
// random rows, then every golden fixture through the seam with it: whole = chunked bit for bit, the logits
// moved (the rounding is applied) but within a stated bound of the f32 cache's, and what moved is reported.
#include <gtest/gtest.h>

#include <cmath>
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <random>
#include <vector>

#include "common/numeric.h"
#include "model/model.h"
#include "ops/kv_quant.h"
#include "quant/codec.h"
#include "step_util.h"
#include "tokenizer/tokenizer.h"

namespace {

using namespace cm;

// The golden fixtures with compressed attention or a window (the seam suite's list).
const char* const kFixtures[] = {"golden/hf_mixed_yarn", "golden/release_real_ratios", "golden/hf_hca_window",
                                 "golden/hf_text",       "golden_quant_nvfp4",         "golden_quant_release"};

struct Diff {
  double max_d = 0, amax = 0;
  int64_t rows = 0, agree = 0;
};
Diff diff_of(const std::vector<float>& got, const std::vector<float>& ref, int64_t V) {
  Diff d;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double x = std::fabs(double(got[i]) - double(ref[i]));
    if (!(x <= d.max_d)) d.max_d = x;  // NaN propagates
    d.amax = std::max(d.amax, std::fabs(double(ref[i])));
  }
  for (size_t r = 0; r * size_t(V) < ref.size(); ++r, ++d.rows) {
    const float* g = got.data() + r * size_t(V);
    const float* f = ref.data() + r * size_t(V);
    d.agree += std::max_element(g, g + V) - g == std::max_element(f, f + V) - f;
  }
  return d;
}

std::vector<float> random_rows(int64_t n, int64_t dim, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.f, 1.f);
  std::vector<float> x(size_t(n * dim));
  for (int64_t r = 0; r < n; ++r) {
    const float mag = std::ldexp(1.0f, int(r % 24) - 12);  // rows from 2^-12 to 2^11
    for (int64_t i = 0; i < dim; ++i) x[size_t(r * dim + i)] = g(rng) * mag;
  }
  return x;
}

// Every nope value is an E4M3 value times its block's power-of-two scale, within half an E4M3 step of the
// input (relative 2^-4 of the block's scale·448 range for the largest); the rope channels are bf16; rounding
// twice changes nothing.
TEST(KvFp8, RowsRoundToE4m3BlocksAndBf16Rope) {
  for (auto [dim, rope] : {std::pair<int64_t, int64_t>{512, 64}, {64, 16}, {96, 32}, {200, 8}}) {
    const int64_t n = 48, nope = dim - rope;
    std::vector<float> x = random_rows(n, dim, uint32_t(dim + rope));
    std::vector<float> y = x;
    kv_fp8_round_cpu(y.data(), n, dim, rope);
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t b0 = 0; b0 < nope; b0 += kKvFp8Block) {
        const int64_t len = std::min(kKvFp8Block, nope - b0);
        float amax = 0;
        for (int64_t i = 0; i < len; ++i) amax = std::max(amax, std::fabs(x[size_t(r * dim + b0 + i)]));
        const float s = std::exp2(std::ceil(std::log2(std::max(amax, 1e-4f) / 448.0f)));
        for (int64_t i = 0; i < len; ++i) {
          const float in = x[size_t(r * dim + b0 + i)], out = y[size_t(r * dim + b0 + i)];
          const float q = out / s;  // an E4M3 value: 3 mantissa bits, |q| <= 448
          ASSERT_LE(std::fabs(q), 448.0f);
          ASSERT_EQ(e4m3_to_f32(e4m3_encode(q, true)), q) << "not an E4M3 value times the block scale";
          // Round to nearest: no more than half an ulp of E4M3 at |in| (2^-4 relative, 2^-10·s absolute
          // in the subnormals).
          const float ulp_half = std::max(std::ldexp(1.0f, std::ilogb(std::max(std::fabs(in), 1e-30f)) - 4),
                                          std::ldexp(s, -10));
          ASSERT_LE(std::fabs(out - in), ulp_half * 1.0001f) << "dim " << dim << " row " << r << " i " << b0 + i;
        }
      }
      for (int64_t i = nope; i < dim; ++i) ASSERT_EQ(y[size_t(r * dim + i)], round_bf16(x[size_t(r * dim + i)]));
    }
    std::vector<float> z = y;
    kv_fp8_round_cpu(z.data(), n, dim, rope);
    EXPECT_EQ(z, y) << "rounding twice changed values (dim " << dim << ")";
  }
  // A zero row stays zero; a NaN stays NaN and an infinity becomes NaN, for non-finite detection.
  std::vector<float> zero(512, 0.0f);
  kv_fp8_round_cpu(zero.data(), 1, 512, 64);
  for (float v : zero) EXPECT_EQ(v, 0.0f);
  std::vector<float> bad = random_rows(1, 512, 5);
  bad[3] = NAN;
  bad[500] = INFINITY;
  kv_fp8_round_cpu(bad.data(), 1, 512, 64);
  EXPECT_TRUE(std::isnan(bad[3]) && std::isnan(bad[500]));
  EXPECT_TRUE(std::isfinite(bad[4]));
}

TEST(KvFp8, IndexKeysShareOneScale) {
  const int64_t n = 24, dim = 128;
  std::vector<float> x = random_rows(n, dim, 9), y = x;
  index_key_fp8_round_cpu(y.data(), n, dim);
  for (int64_t r = 0; r < n; ++r) {
    float amax = 0;
    for (int64_t i = 0; i < dim; ++i) amax = std::max(amax, std::fabs(x[size_t(r * dim + i)]));
    const float s = std::max(amax, 1e-4f) / 448.0f;
    for (int64_t i = 0; i < dim; ++i) {
      const float in = x[size_t(r * dim + i)], out = y[size_t(r * dim + i)];
      EXPECT_EQ(out, e4m3_to_f32(e4m3_encode(in / s, true)) * s);
      EXPECT_LE(std::fabs(out - in), std::max(std::fabs(in) / 16, s / 512) * 1.0001f);
    }
  }
}

// Every golden fixture with the FP8 cache: a prompt's logits are the same bits whole and in chunks of 1 and 7,
// and they differ from the f32 cache's (the rounding is applied where the fixture attends).
TEST(KvFp8, GoldenFixturesChunkInvariant) {
  for (const char* f : kFixtures) {
    const std::string dir = std::string(CLAWMINE_TEST_DATA) + "/" + f;
    auto m = model_load(dir);
    const test::Expected e = test::read_expected(dir);
    const int64_t V = m->config.vocab_size, T = int64_t(e.tokens.size());
    BackendOptions fp8;
    fp8.kv_cache = KvCache::FP8;
    auto run = [&](const BackendOptions& o, int64_t chunk) {
      auto be = test::reserved_backend(*m, Device::CPU, 1, int32_t(T), T + 1, o);
      return test::feed_chunks(*be, 0, e.tokens.data(), T, chunk, V);
    };
    const std::vector<float> ref = run(BackendOptions{}, 0), whole = run(fp8, 0);
    EXPECT_EQ(run(fp8, 1), whole) << f << ": chunks of 1 differ from the whole prompt";
    EXPECT_EQ(run(fp8, 7), whole) << f << ": chunks of 7 differ from the whole prompt";
    const Diff d = diff_of(whole, ref, V);
    std::printf("  %s (%lld tokens): fp8 cache vs f32 cache: max|dlogit| %.4g (%.3f%% of max|logit| %.3g), argmax "
                "agreement %.1f%%\n",
                f, (long long)T, d.max_d, 100 * d.max_d / d.amax, d.amax, 100.0 * double(d.agree) / double(d.rows));
    EXPECT_GT(d.max_d, 0.0) << f << ": the FP8 rounding changed nothing";
    // Random weights amplify any perturbation (these fixtures' logits move by 25-50% of max|logit|, where
    // a trained model's perplexity does not move; the test below); the top token still mostly agrees.
    EXPECT_GE(double(d.agree), 0.75 * double(d.rows)) << f;
  }
}

// The trained default model (window, CSA and HCA layers) on 1,024 tokens of its held-out text: the FP8 cache's
// mean next-token loss is within 0.5% of the f32 cache's (the whole held-out text, 51,150 tokens: perplexity
// 33.239 -> 33.221).
TEST(KvFp8, DefaultModelLossUnchanged) {
  const std::string dir = std::string(CLAWMINE_TEST_DATA) + "/../../models/default";
  auto m = model_load(dir);
  std::ifstream in(dir + "/heldout.txt");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<int32_t> ids = Tokenizer::load(dir).encode(text);
  ASSERT_GT(ids.size(), 1025u);
  ids.resize(1025);
  const int64_t V = m->config.vocab_size, T = 1024;
  auto loss = [&](const BackendOptions& o) {
    auto be = test::reserved_backend(*m, Device::CPU, 1, 256, T + 1, o);
    const std::vector<float> lg = test::feed_chunks(*be, 0, ids.data(), T, 256, V);
    double nll = 0;
    for (int64_t t = 0; t < T; ++t) {
      const float* r = lg.data() + t * V;
      const float mx = *std::max_element(r, r + V);
      double z = 0;
      for (int64_t v = 0; v < V; ++v) z += std::exp(double(r[v] - mx));
      nll += std::log(z) + mx - r[ids[size_t(t + 1)]];
    }
    return nll / double(T);
  };
  BackendOptions fp8;
  fp8.kv_cache = KvCache::FP8;
  const double base = loss(BackendOptions{}), q = loss(fp8);
  std::printf("  default model, 1,024 held-out tokens: mean loss %.5f (f32 cache) vs %.5f (fp8 cache)\n", base, q);
  EXPECT_NE(base, q);
  EXPECT_LT(std::fabs(q - base), 0.005 * base);
}

}  // namespace
