// Sampler properties: greedy = argmax, filters never leak tokens outside their set, penalties hit
// exactly the seen ids, seeds reproduce, and the empirical distribution matches softmax(l/T).
// Every expected set / distribution is computed here independently of the sampler.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <set>

#include "common/error.h"
#include "runtime/row_sampler.h"
#include "sampling/sampler.h"

using namespace cm;

namespace {
// The engine's sampler over an explicit history, as these tests drive it: a RowSampler per draw
// (its penalty counts from `hist`), the draw counter advancing per call like a stream.
class Sampler {
 public:
  explicit Sampler(const SamplingParams& p) : p_(p) { validate_sampling_params(p); }
  int32_t sample(const float* l, int64_t vocab, const std::vector<int32_t>& hist) {
    runtime::RowSampler s(p_, hist);
    return s.sample(l, vocab, n_++, {});
  }

 private:
  SamplingParams p_;
  int64_t n_ = 0;
};
std::vector<double> softmax(const std::vector<float>& l, double t) {
  double mx = *std::max_element(l.begin(), l.end());
  std::vector<double> p(l.size());
  double z = 0;
  for (size_t i = 0; i < l.size(); ++i) z += p[i] = std::exp((l[i] - mx) / t);
  for (double& x : p) x /= z;
  return p;
}
// Ids sorted by descending logit (lower id first on ties).
std::vector<int> ranked(const std::vector<float>& l) {
  std::vector<int> idx(l.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return l[a] > l[b]; });
  return idx;
}
std::vector<float> random_logits(size_t n, uint32_t seed, float scale = 3.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, scale);  // test data only: platform variance is fine
  std::vector<float> l(n);
  for (float& x : l) x = d(g);
  return l;
}
std::vector<int> counts(Sampler& s, const std::vector<float>& l, int draws,
                        const std::vector<int32_t>& hist = {}) {
  std::vector<int> c(l.size(), 0);
  for (int i = 0; i < draws; ++i) ++c[s.sample(l.data(), l.size(), hist)];
  return c;
}
// |freq - p| within 5 binomial standard deviations (+ a tiny floor) for every id.
void expect_matches(const std::vector<int>& c, const std::vector<double>& p, int draws) {
  for (size_t i = 0; i < p.size(); ++i) {
    double f = double(c[i]) / draws;
    double sd = std::sqrt(p[i] * (1 - p[i]) / draws);
    EXPECT_NEAR(f, p[i], 5 * sd + 1e-4) << "id " << i;
  }
}
SamplingParams temp(float t, uint64_t seed = 1) {
  SamplingParams p;
  p.temperature = t;
  p.seed = seed;
  return p;
}
}  // namespace

TEST(Sampler, GreedyIsArgmaxLowestIdOnTies) {
  Sampler s(SamplingParams{});
  auto l = random_logits(1000, 7);
  EXPECT_EQ(s.sample(l.data(), l.size(), {}), ranked(l)[0]);
  std::vector<float> tie = {0.0f, 3.0f, -INFINITY, 3.0f, 1.0f};
  EXPECT_EQ(s.sample(tie.data(), tie.size(), {}), 1);
  std::vector<float> neg = {-INFINITY, -5.0f, -INFINITY};
  EXPECT_EQ(s.sample(neg.data(), neg.size(), {}), 1);
}

TEST(Sampler, RejectsBadParams) {
  auto bad = [](auto mutate) {
    SamplingParams p;
    mutate(p);
    EXPECT_THROW(Sampler{p}, Error);
  };
  bad([](SamplingParams& p) { p.temperature = -0.1f; });
  bad([](SamplingParams& p) { p.temperature = NAN; });
  bad([](SamplingParams& p) { p.temperature = INFINITY; });
  bad([](SamplingParams& p) { p.top_k = -1; });
  bad([](SamplingParams& p) { p.top_p = 0.0f; });
  bad([](SamplingParams& p) { p.top_p = 1.5f; });
  bad([](SamplingParams& p) { p.top_p = NAN; });
  bad([](SamplingParams& p) { p.min_p = -0.1f; });
  bad([](SamplingParams& p) { p.min_p = 1.1f; });
  bad([](SamplingParams& p) { p.repetition_penalty = 0.0f; });
  bad([](SamplingParams& p) { p.repetition_penalty = -1.0f; });
  bad([](SamplingParams& p) { p.presence_penalty = NAN; });
  bad([](SamplingParams& p) { p.frequency_penalty = INFINITY; });
  SamplingParams ok;
  ok.temperature = 0.8f, ok.top_k = 40, ok.top_p = 0.95f, ok.min_p = 0.05f;
  ok.repetition_penalty = 1.1f, ok.presence_penalty = -0.5f, ok.frequency_penalty = 0.5f;
  EXPECT_NO_THROW(Sampler{ok});
}

TEST(Sampler, RejectsBadLogitsAndHistory) {
  for (float t : {0.0f, 1.0f}) {
    SamplingParams p = temp(t);
    p.repetition_penalty = 1.2f;
    Sampler s(p);
    std::vector<float> l = {1.0f, NAN, 0.5f};
    EXPECT_THROW(s.sample(l.data(), 3, {}), Error);
    l[1] = INFINITY;
    EXPECT_THROW(s.sample(l.data(), 3, {}), Error);
    l = {-INFINITY, -INFINITY};
    EXPECT_THROW(s.sample(l.data(), 2, {}), Error);
    l = {1.0f, 2.0f};
    EXPECT_THROW(s.sample(l.data(), 2, {5}), Error);
    EXPECT_THROW(s.sample(l.data(), 2, {-1}), Error);
    EXPECT_THROW(s.sample(l.data(), 0, {}), Error);
    EXPECT_THROW(s.sample(nullptr, 2, {}), Error);
  }
}

TEST(Sampler, TemperatureMatchesSoftmax) {
  std::vector<float> l = {1.0f, 2.0f, 0.5f, -1.0f, 1.5f, 0.0f, 2.2f, -0.3f};
  const int draws = 200000;
  for (float t : {0.7f, 1.0f, 2.5f}) {
    Sampler s(temp(t, 42));
    expect_matches(counts(s, l, draws), softmax(l, t), draws);
  }
}

TEST(Sampler, TopKNeverLeavesTheKBest) {
  auto l = random_logits(200, 3);
  auto r = ranked(l);
  SamplingParams p = temp(1.5f, 9);
  p.top_k = 5;
  Sampler s(p);
  auto c = counts(s, l, 20000);
  std::set<int> best(r.begin(), r.begin() + 5);
  std::vector<float> sub;
  for (int id : r) {
    if (best.count(id)) {
      EXPECT_GT(c[id], 0) << id;
      sub.push_back(l[id]);
    } else {
      EXPECT_EQ(c[id], 0) << "id " << id << " is outside the top 5";
    }
  }
  // Within the k best, frequencies follow the renormalised softmax.
  std::vector<int> cs;
  for (int id : r) if (best.count(id)) cs.push_back(c[id]);
  expect_matches(cs, softmax(sub, 1.5), 20000);
}

TEST(Sampler, TopPNeverLeavesTheNucleus) {
  // p = {0.5, 0.2, 0.15, 0.1, 0.05}: with top_p 0.8 the nucleus is {0, 1, 2} (0.7 < 0.8 <= 0.85).
  std::vector<float> l = {std::log(0.5f), std::log(0.2f), std::log(0.15f), std::log(0.1f),
                          std::log(0.05f)};
  SamplingParams p = temp(1.0f, 5);
  p.top_p = 0.8f;
  Sampler s(p);
  const int draws = 50000;
  auto c = counts(s, l, draws);
  EXPECT_EQ(c[3], 0);
  EXPECT_EQ(c[4], 0);
  expect_matches(c, {0.5 / 0.85, 0.2 / 0.85, 0.15 / 0.85, 0, 0}, draws);

  // Random large vocabulary, nucleus computed independently from the tempered softmax.
  for (float top_p : {0.3f, 0.9f}) {
    auto big = random_logits(5000, 11);
    auto pr = softmax(big, 0.8);
    auto r = ranked(big);
    std::set<int> nucleus;
    double cum = 0;
    for (int id : r) {
      if (cum >= top_p) break;
      nucleus.insert(id);
      cum += pr[id];
    }
    SamplingParams q = temp(0.8f, 77);
    q.top_p = top_p;
    Sampler s2(q);
    for (int i = 0; i < 3000; ++i) {
      int id = s2.sample(big.data(), big.size(), {});
      ASSERT_TRUE(nucleus.count(id)) << "id " << id << " outside the top_p=" << top_p << " nucleus";
    }
  }
}

TEST(Sampler, TopPKeepsAtLeastOneToken) {
  std::vector<float> l = {5.0f, 0.0f, 0.0f};
  SamplingParams p = temp(1.0f, 1);
  p.top_p = 1e-6f;
  Sampler s(p);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(s.sample(l.data(), 3, {}), 0);
}

TEST(Sampler, MinPDropsTokensBelowTheThreshold) {
  std::vector<float> l = {std::log(0.5f), std::log(0.2f), std::log(0.15f), std::log(0.1f),
                          std::log(0.05f)};
  SamplingParams p = temp(1.0f, 8);
  p.min_p = 0.25f;  // threshold 0.125 -> keeps {0, 1, 2}
  Sampler s(p);
  const int draws = 50000;
  auto c = counts(s, l, draws);
  expect_matches(c, {0.5 / 0.85, 0.2 / 0.85, 0.15 / 0.85, 0, 0}, draws);
  // At temperature 0.5 the tempered probabilities are 0.25:0.04:0.0225:0.01:0.0025 (relative),
  // so min_p 0.1 keeps only {0, 1}.
  p.temperature = 0.5f;
  p.min_p = 0.1f;
  Sampler s2(p);
  auto c2 = counts(s2, l, draws);
  expect_matches(c2, {0.25 / 0.29, 0.04 / 0.29, 0, 0, 0}, draws);
}

TEST(Sampler, RepetitionPenaltyHitsSeenIdsOnly) {
  SamplingParams p;
  p.repetition_penalty = 1.5f;
  Sampler s(p);
  // Positive logit divided: 2.0 -> 1.333 < 1.9.
  std::vector<float> a = {2.0f, 1.9f, -1.0f};
  EXPECT_EQ(s.sample(a.data(), 3, {}), 0);
  EXPECT_EQ(s.sample(a.data(), 3, {0}), 1);
  EXPECT_EQ(s.sample(a.data(), 3, {0, 0, 0}), 1);  // once per distinct id, not per occurrence
  a = {2.0f, 1.3f, -1.0f};
  EXPECT_EQ(s.sample(a.data(), 3, {0, 0, 0}), 0);  // 1.333 > 1.3
  // Negative logit multiplied: -1.0 -> -1.5 < -1.2.
  std::vector<float> b = {-1.0f, -1.2f};
  EXPECT_EQ(s.sample(b.data(), 2, {}), 0);
  EXPECT_EQ(s.sample(b.data(), 2, {0}), 1);
  // Unseen ids are untouched: penalising id 1 does not change the winner 0.
  EXPECT_EQ(s.sample(b.data(), 2, {1}), 0);
}

TEST(Sampler, PresenceAndFrequencyPenalties) {
  std::vector<float> l = {1.0f, 0.8f, 0.9f};
  SamplingParams p;
  p.presence_penalty = 0.15f;
  Sampler pres(p);
  EXPECT_EQ(pres.sample(l.data(), 3, {1}), 0);
  EXPECT_EQ(pres.sample(l.data(), 3, {0}), 2);        // 0.85 < 0.9
  EXPECT_EQ(pres.sample(l.data(), 3, {0, 0, 0}), 2);  // presence counts once
  p = SamplingParams{};
  p.frequency_penalty = 0.04f;
  Sampler freq(p);
  EXPECT_EQ(freq.sample(l.data(), 3, {0, 0}), 0);     // 0.92 > 0.9
  EXPECT_EQ(freq.sample(l.data(), 3, {0, 0, 0}), 2);  // 0.88 < 0.9

  // Exact penalised distribution under sampling: all three penalties at once.
  SamplingParams q = temp(1.0f, 99);
  q.repetition_penalty = 1.3f, q.presence_penalty = 0.2f, q.frequency_penalty = 0.1f;
  std::vector<float> m = {0.5f, 1.0f, -0.3f, 0.2f};
  std::vector<int32_t> hist = {1, 1, 2};
  std::vector<float> want = {0.5f, 1.0f / 1.3f - 2 * 0.1f - 0.2f, -0.3f * 1.3f - 0.1f - 0.2f, 0.2f};
  Sampler s(q);
  const int draws = 100000;
  expect_matches(counts(s, m, draws, hist), softmax(want, 1.0), draws);
}

TEST(Sampler, SameSeedSameSequence) {
  auto l = random_logits(500, 21, 1.0f);
  SamplingParams p = temp(1.0f, 1234);
  p.top_k = 50, p.top_p = 0.9f, p.min_p = 0.01f, p.repetition_penalty = 1.1f;
  auto run = [&](uint64_t seed) {
    SamplingParams q = p;
    q.seed = seed;
    Sampler s(q);
    std::vector<int32_t> hist = {3, 4, 5};
    for (int i = 0; i < 200; ++i) hist.push_back(s.sample(l.data(), l.size(), hist));
    return hist;
  };
  EXPECT_EQ(run(1234), run(1234));
  EXPECT_NE(run(1234), run(1235));
  // The draw at a position depends on (seed, position) only: the same stream again.
  Sampler s(p), s2(p);
  std::vector<int32_t> a, b;
  for (int i = 0; i < 50; ++i) a.push_back(s.sample(l.data(), l.size(), {}));
  for (int i = 0; i < 50; ++i) b.push_back(s2.sample(l.data(), l.size(), {}));
  EXPECT_EQ(a, b);
}

// logit_bias adds to the raw logits before everything else: -100 bans the argmax, a positive bias
// makes a weak id the argmax, and at temperature 1 the distribution is softmax(l + bias).
TEST(Sampler, LogitBiasShiftsLogitsBeforePenaltiesAndTemperature) {
  const std::vector<float> l = random_logits(50, 11);
  const int top = ranked(l)[0], second = ranked(l)[1], last = ranked(l).back();
  SamplingParams p;
  p.logit_bias = {{top, -100.0f}};
  EXPECT_EQ(Sampler(p).sample(l.data(), l.size(), {}), second);
  p.logit_bias = {{last, 100.0f}};
  EXPECT_EQ(Sampler(p).sample(l.data(), l.size(), {}), last);
  p.logit_bias = {{top, -100.0f}, {int32_t(l.size()) + 5, 50.0f}, {-1, 50.0f}};  // out-of-vocab ids: ignored
  EXPECT_EQ(Sampler(p).sample(l.data(), l.size(), {}), second);

  // With a bias the repetition penalty acts on the biased logit: (l + b) / r for a positive one.
  std::vector<float> two = {1.0f, 1.5f};
  p = SamplingParams{};
  p.logit_bias = {{0, 2.0f}};       // id 0: 3.0
  p.repetition_penalty = 2.5f;      // seen id 0: 3.0 / 2.5 = 1.2 < 1.5
  EXPECT_EQ(Sampler(p).sample(two.data(), 2, {0}), 1);
  p.repetition_penalty = 1.5f;      // 3.0 / 1.5 = 2.0 > 1.5
  EXPECT_EQ(Sampler(p).sample(two.data(), 2, {0}), 0);

  std::vector<float> biased = l;
  SamplingParams t = temp(1.0f, 7);
  for (int id : {3, 17, 41}) {
    t.logit_bias.push_back({id, 2.5f});
    biased[size_t(id)] += 2.5f;
  }
  Sampler s(t);
  const int draws = 60000;
  expect_matches(counts(s, l, draws), softmax(biased, 1.0), draws);

  SamplingParams nan_bias;
  nan_bias.logit_bias = {{0, NAN}};
  EXPECT_THROW(Sampler{nan_bias}, Error);
}
