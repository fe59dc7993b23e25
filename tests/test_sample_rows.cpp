// The row sampler of ops/sample.h on the CPU (the GPU kernel is checked against it in the op table):
// its exp and Philox against references, greedy ties, the filters' kept sets computed here
// independently, the empirical distribution against softmax(l / T), bias, penalties, masks, the raw
// logprob, counter-based reproducibility, and the errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <set>

#include "common/error.h"
#include "ops/sample.h"
#include "ops/sample_math.h"

using namespace cm;

namespace {

struct One {
  int32_t token = -7;
  float logprob = 0;
  int32_t status = -7;
};

One sample_one(std::vector<float> l, const SampleParams& p, std::vector<SampleAdjust> adj = {},
               const std::vector<uint32_t>& mask = {}) {
  One o;
  SampleArgs a;
  a.logits = l.data();
  a.rows = 1;
  a.vocab = int64_t(l.size());
  a.params = &p;
  std::vector<int64_t> off{0, int64_t(adj.size())};
  if (!adj.empty()) a.adj = adj.data(), a.adj_offsets = off.data();
  if (!mask.empty()) a.mask = mask.data(), a.mask_words = int64_t(mask.size());
  a.token = &o.token;
  a.logprob = &o.logprob;
  a.status = &o.status;
  sample_rows_cpu(a);
  return o;
}

std::vector<double> softmax(const std::vector<float>& l, double t) {
  const double mx = *std::max_element(l.begin(), l.end());
  std::vector<double> p(l.size());
  double z = 0;
  for (size_t i = 0; i < l.size(); ++i) z += p[i] = std::exp((l[i] - mx) / t);
  for (double& x : p) x /= z;
  return p;
}

std::vector<float> random_logits(size_t n, uint64_t seed, float amp) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<float> u(-amp, amp);
  std::vector<float> l(n);
  for (float& x : l) x = u(g);
  return l;
}

}  // namespace

TEST(SampleMath, ExpMatchesTheLibraryWithin2Ulp) {
  double worst = 0;
  for (int i = 0; i <= 800000; ++i) {
    const float y = -80.0f * float(i) / 800000.0f;
    const double ref = std::exp(double(y));
    worst = std::max(worst, std::abs(double(sample_math::exp_nonpos(y)) - ref) / ref);
  }
  EXPECT_LT(worst, 2.4e-7);  // 2 ulp of a float
  EXPECT_EQ(sample_math::exp_nonpos(0.0f), 1.0f);
  EXPECT_EQ(sample_math::exp_nonpos(-80.5f), 0.0f);
  EXPECT_EQ(sample_math::exp_nonpos(-INFINITY), 0.0f);
  EXPECT_EQ(sample_math::weight(3.0f, 3.0f, 0.7f), 2147483648u);
}

TEST(SampleMath, PhiloxKnownAnswer) {
  // Random123's known-answer test for philox4x32-10, counter {0,0,0,0}, key {0,0}: words 0 and 1.
  EXPECT_EQ(sample_math::philox_u64(0, 0), 0xe169c58d6627e8d5ull);
  EXPECT_NE(sample_math::philox_u64(0, 1), sample_math::philox_u64(0, 0));
  EXPECT_NE(sample_math::philox_u64(1, 0), sample_math::philox_u64(0, 0));
  EXPECT_EQ(sample_math::scale_draw(~0ull, 10), 9u);
  EXPECT_EQ(sample_math::scale_draw(0, 10), 0u);
  EXPECT_EQ(sample_math::scale_draw(1ull << 63, 10), 5u);
}

TEST(SampleRows, GreedyIsTheArgmaxLowestIdOnTies) {
  std::vector<float> l = random_logits(5000, 1, 4.0f);
  l[1234] = 9.0f;
  l[4321] = 9.0f;
  SampleParams p;
  const One o = sample_one(l, p);
  EXPECT_EQ(o.status, kSampleOk);
  EXPECT_EQ(o.token, 1234);
  const std::vector<double> sm = softmax(l, 1.0);
  EXPECT_NEAR(o.logprob, std::log(sm[1234]), 1e-5);
}

TEST(SampleRows, DrawsFollowSoftmaxOverTheTemperature) {
  const std::vector<float> l{1.0f, 0.2f, -0.5f, 2.0f, 0.0f, -3.0f, 1.5f, 0.7f};
  for (float t : {0.5f, 1.0f, 1.7f}) {
    const std::vector<double> want = softmax(l, t);
    std::vector<double> got(l.size(), 0);
    const int n = 40000;
    SampleParams p;
    p.temperature = t;
    p.seed = 99;
    for (int i = 0; i < n; ++i) {
      p.counter = uint64_t(i);
      const One o = sample_one(l, p);
      ASSERT_EQ(o.status, kSampleOk);
      got[size_t(o.token)] += 1.0 / n;
    }
    for (size_t i = 0; i < l.size(); ++i)  // 5 standard deviations of a binomial proportion
      EXPECT_NEAR(got[i], want[i], 5 * std::sqrt(want[i] * (1 - want[i]) / n) + 1e-4) << "t " << t << " id " << i;
  }
}

TEST(SampleRows, FiltersKeepExactlyTheirSets) {
  const std::vector<float> l = random_logits(3000, 7, 3.0f);
  std::vector<int> order(l.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return l[size_t(a)] > l[size_t(b)]; });
  const std::vector<double> sm = softmax(l, 1.0);
  // top_k 20: the 20 largest logits (no ties among random floats)
  const std::set<int> top20(order.begin(), order.begin() + 20);
  // top_p 0.3: the smallest most-probable prefix with mass >= 0.3
  std::set<int> nucleus;
  double mass = 0;
  for (int id : order) {
    if (mass >= 0.3) break;
    nucleus.insert(id);
    mass += sm[size_t(id)];
  }
  // min_p 0.5: p >= 0.5 p_max
  std::set<int> minp;
  for (size_t i = 0; i < l.size(); ++i)
    if (sm[i] >= 0.5 * sm[size_t(order[0])]) minp.insert(int(i));
  ASSERT_GT(nucleus.size(), 3u);
  ASSERT_GT(minp.size(), 1u);
  struct F {
    int top_k;
    float top_p, min_p;
    const std::set<int>* set;
  } filters[] = {{20, 1.0f, 0.0f, &top20}, {0, 0.3f, 0.0f, &nucleus}, {0, 1.0f, 0.5f, &minp}};
  for (const F& f : filters) {
    std::set<int> seen;
    SampleParams p;
    p.temperature = 1.0f;
    p.top_k = f.top_k;
    p.top_p = f.top_p;
    p.min_p = f.min_p;
    for (int i = 0; i < 3000; ++i) {
      p.counter = uint64_t(i);
      seen.insert(sample_one(l, p).token);
    }
    EXPECT_EQ(seen, *f.set) << "top_k " << f.top_k << " top_p " << f.top_p << " min_p " << f.min_p;
  }
}

TEST(SampleRows, BiasPenaltiesAndMask) {
  std::vector<float> l = random_logits(1000, 3, 2.0f);
  l[10] = 8.0f;  // the greedy token
  SampleParams p;
  // bias -100 bans it, +100 on another forces that one
  EXPECT_NE(sample_one(l, p, {{10, 0, -100.0f, 0}}).token, 10);
  const One forced = sample_one(l, p, {{777, 0, 100.0f, 0}});
  EXPECT_EQ(forced.token, 777);
  EXPECT_NEAR(forced.logprob, std::log(softmax(l, 1.0)[777]), 1e-5);  // the raw distribution's logprob
  // repetition 2 on a positive logit halves it: 8 -> 4, below another token at 5
  l[20] = 5.0f;
  p.repetition_penalty = 2.0f;
  EXPECT_EQ(sample_one(l, p, {{10, 1, 0.0f, 0}}).token, 20);
  // presence 2 + frequency 0.5 x 3 -> 8 - 3.5 = 4.5 < 5
  p.repetition_penalty = 1.0f;
  p.presence_penalty = 2.0f;
  p.frequency_penalty = 0.5f;
  EXPECT_EQ(sample_one(l, p, {{10, 3, 0.0f, 0}}).token, 20);
  EXPECT_EQ(sample_one(l, p, {{10, 2, 0.0f, 0}}).token, 10);  // 8 - 3 = 5: a tie at 5, lowest id wins
  // a mask allowing only ids 500..531 (one word)
  std::vector<uint32_t> mask((1000 + 31) / 32, 0);
  mask[500 / 32 + 1] = 0xffffffffu;  // ids 512..543
  SampleParams q;
  q.temperature = 1.0f;
  for (int i = 0; i < 200; ++i) {
    q.counter = uint64_t(i);
    const One o = sample_one(l, q, {}, mask);
    ASSERT_EQ(o.status, kSampleOk);
    EXPECT_GE(o.token, 512);
    EXPECT_LT(o.token, 544);
  }
  std::vector<uint32_t> none(mask.size(), 0);
  EXPECT_EQ(sample_one(l, q, {}, none).status, kSampleNothingAllowed);
  EXPECT_EQ(sample_one(l, q, {}, none).token, -1);
}

TEST(SampleRows, AdjustmentsWriteBackAndKeepTheOriginal) {
  std::vector<float> l = random_logits(64, 5, 1.0f);
  const float orig = l[9];
  std::vector<SampleAdjust> adj{{9, 0, 1.5f, 0}};
  SampleParams p;
  std::vector<int64_t> off{0, 1};
  One o;
  SampleArgs a;
  a.logits = l.data(), a.rows = 1, a.vocab = 64, a.params = &p, a.adj = adj.data(), a.adj_offsets = off.data();
  a.token = &o.token, a.logprob = &o.logprob, a.status = &o.status;
  sample_rows_cpu(a);
  EXPECT_EQ(adj[0].orig, orig);
  EXPECT_EQ(l[9], orig + 1.5f);
}

TEST(SampleRows, ACounterDrawsTheSameTokenWhateverCameBefore) {
  const std::vector<float> l = random_logits(129280, 11, 6.0f);
  SampleParams p;
  p.temperature = 0.9f;
  p.top_p = 0.95f;
  p.seed = 1234;
  p.counter = 17;
  const One a = sample_one(l, p);
  for (int i = 0; i < 5; ++i) {
    SampleParams other = p;
    other.counter = uint64_t(i);
    sample_one(l, other);
  }
  EXPECT_EQ(sample_one(l, p).token, a.token);
  p.seed = 1235;
  std::set<int32_t> tokens;
  for (int i = 0; i < 20; ++i) {
    p.counter = uint64_t(i);
    tokens.insert(sample_one(l, p).token);
  }
  EXPECT_GT(tokens.size(), 5u);  // a flat-ish 129K distribution: draws differ
}

TEST(SampleRows, BadInputIsAnErrorOrAStatus) {
  std::vector<float> l = random_logits(100, 2, 1.0f);
  SampleParams p;
  l[50] = NAN;
  EXPECT_EQ(sample_one(l, p).status, kSampleNonFinite);
  l[50] = INFINITY;
  EXPECT_EQ(sample_one(l, p).status, kSampleNonFinite);
  l[50] = -INFINITY;  // -inf is a banned token, not an error
  EXPECT_EQ(sample_one(l, p).status, kSampleOk);
  p.top_p = 0.0f;
  EXPECT_THROW(sample_one(l, p), Error);
  p = SampleParams{};
  p.temperature = -1;
  EXPECT_THROW(sample_one(l, p), Error);
  p = SampleParams{};
  EXPECT_THROW(sample_one(l, p, {{100, 0, 1.0f, 0}}), Error);               // id outside the vocabulary
  EXPECT_THROW(sample_one(l, p, {{3, 0, 1.0f, 0}, {3, 1, 0.0f, 0}}), Error);  // adjusted twice
}

// top_n: the raw distribution's most likely ids (value descending, lowest id first on ties), their
// logprobs under the raw softmax whatever the bias, penalties, mask and temperature, -1 / NaN past the
// vocabulary's end and for a non-finite row.
TEST(SampleRows, TopNIsTheRawDistributionsHead) {
  std::vector<float> l = random_logits(500, 21, 4.0f);
  l[300] = 9.0f, l[17] = 9.0f, l[450] = 8.5f;  // a tie at the top: 17 before 300
  SampleParams p;
  p.temperature = 0.7f, p.top_k = 3, p.seed = 2;
  std::vector<SampleAdjust> adj(1);
  adj[0].id = 17, adj[0].bias = -50.0f;  // the bias changes the draw, not the raw top list
  std::vector<float> x = l;
  std::vector<int64_t> off{0, 1};
  int32_t token = 0, status = 0, top_id[8];
  float logprob = 0, top_lp[8];
  SampleArgs a;
  a.logits = x.data(), a.rows = 1, a.vocab = int64_t(l.size()), a.params = &p;
  a.adj = adj.data(), a.adj_offsets = off.data();
  a.token = &token, a.logprob = &logprob, a.status = &status;
  a.top_n = 8, a.top_id = top_id, a.top_logprob = top_lp;
  sample_rows_cpu(a);
  ASSERT_EQ(status, kSampleOk);
  EXPECT_NE(token, 17);
  std::vector<int32_t> want(l.size());
  std::iota(want.begin(), want.end(), 0);
  std::stable_sort(want.begin(), want.end(), [&](int32_t i, int32_t j) { return l[size_t(i)] > l[size_t(j)]; });
  const std::vector<double> sm = softmax(l, 1.0);
  EXPECT_EQ(top_id[0], 17);
  EXPECT_EQ(top_id[1], 300);
  EXPECT_EQ(top_id[2], 450);
  for (int k = 0; k < 8; ++k) {
    EXPECT_EQ(top_id[k], want[size_t(k)]) << k;
    EXPECT_NEAR(top_lp[k], std::log(sm[size_t(want[size_t(k)])]), 1e-5) << k;
  }
  // a vocabulary shorter than top_n: the rest is -1 / NaN
  std::vector<float> small{1.0f, 3.0f, 2.0f};
  a.logits = small.data(), a.vocab = 3, a.adj = nullptr, a.adj_offsets = nullptr;
  sample_rows_cpu(a);
  EXPECT_EQ(top_id[0], 1);
  EXPECT_EQ(top_id[1], 2);
  EXPECT_EQ(top_id[2], 0);
  EXPECT_EQ(top_id[3], -1);
  EXPECT_TRUE(std::isnan(top_lp[7]));
  // a non-finite row: no list
  small[1] = NAN;
  sample_rows_cpu(a);
  EXPECT_EQ(status, kSampleNonFinite);
  EXPECT_EQ(top_id[0], -1);
  // top_n out of range
  a.top_n = kMaxSampleTopN + 1;
  EXPECT_THROW(sample_rows_cpu(a), Error);
}
