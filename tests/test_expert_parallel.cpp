// Expert parallelism on the CPU backend: R simulated ranks (threads over
// ThreadComm), each with its own model loaded with only its routed experts and
// its own CpuBackend, give logits bit-identical to one rank on every golden
// fixture (the fixtures' first layers are hash-routed), for R = 2, 3 (8 experts
// over 3 ranks: uneven ranges), 4 and 8, in one prefill and in 1-token decode
// steps (with R > 1 most ranks then have no rows of their own). Also: every
// token routed to one rank's experts, and a rank's weights hold only its experts.
#include <gtest/gtest.h>

#include <cstring>

#include "common/error.h"
#include "comm/comm.h"
#include "backend/cpu/cpu_backend.h"
#include "model/model.h"
#include "rank_util.h"
#include "step_util.h"

using namespace cm;

namespace {

const std::string kData = CLAWMINE_TEST_DATA;

// Changes a model's routing in place so that every token picks the experts
// [first, first + K): hash layers through tid2eid, score layers through the bias.
void route_all_to(Model& m, int32_t first) {
  const Config& c = m.config;
  for (LayerWeights& lw : m.weights.layers) {
    if (!lw.tid2eid.empty())
      for (size_t i = 0; i < lw.tid2eid.size(); ++i) lw.tid2eid[i] = first + int32_t(i % size_t(c.n_experts_per_tok));
    else
      for (int64_t e = 0; e < c.n_routed_experts; ++e)
        lw.gate_bias[size_t(e)] = e >= first && e < first + c.n_experts_per_tok ? 1.0e4f : 0.0f;
  }
}

struct RankRun {
  std::vector<float> logits;
  std::vector<int32_t> recv_pairs;  // pairs this rank received in the last MoE layer of the last step
};

// Runs tokens through R ranks (chunk tokens per step, 0 = one prefill); one entry per rank.
// Three experts per token instead of the fixtures' two (so the order of a row's
// additions matters: with two, a + b == b + a): hash layers get tid2eid rows
// (t, t+3, t+5) mod E.
void three_per_token(Model& m) {
  Config& c = m.config;
  c.n_experts_per_tok = 3;
  for (LayerWeights& lw : m.weights.layers) {
    if (lw.tid2eid.empty()) continue;
    lw.tid2eid.assign(size_t(c.vocab_size * 3), 0);
    for (int64_t t = 0; t < c.vocab_size; ++t)
      for (int64_t j = 0; j < 3; ++j)
        lw.tid2eid[size_t(t * 3 + j)] = int32_t((t + (j == 0 ? 0 : j == 1 ? 3 : 5)) % c.n_routed_experts);
  }
}

std::vector<RankRun> run_ep(const std::string& dir, int R, const std::vector<int32_t>& toks, int64_t chunk,
                            int32_t route_to = -1, bool three = false) {
  std::vector<RankRun> out(static_cast<size_t>(R));
  test::run_ranks(R, [&](Comm& comm) {
    auto m = test::load_rank(dir, comm.rank(), R);
    if (three) three_per_token(*m);
    if (route_to >= 0) route_all_to(*m, route_to);
    BackendOptions opt;
    opt.ep_comm = &comm;
    CpuBackend be(*m, opt);
    const int64_t n = int64_t(toks.size());
    be.reserve(CacheShape{1, int32_t(chunk > 0 ? std::min(chunk, n) : n), n});
    RankRun& rr = out[size_t(comm.rank())];
    rr.logits = test::feed_chunks(be, 0, toks.data(), n, chunk, m->config.vocab_size);
    rr.recv_pairs = be.act().ep.recv_n;
  });
  return out;
}

std::vector<float> run_one(const std::string& dir, const std::vector<int32_t>& toks, int64_t chunk,
                           int32_t route_to = -1, bool three = false) {
  auto m = model_load(dir);
  if (three) three_per_token(*m);
  if (route_to >= 0) route_all_to(*m, route_to);
  return test::cpu_logits(*m, toks, chunk);
}

void expect_bit_equal(const std::vector<float>& a, const std::vector<float>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], 4) != 0 && bad++ == 0) first = i;
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " logits differ, first at " << first << " (" << a[first] << " vs "
                     << b[first] << ")";
}

class EpGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(EpGolden, RanksMatchOneRankBitExact) {
  const std::string dir = kData + "/" + GetParam();
  test::Expected g = test::read_expected(dir);
  for (int64_t chunk : {int64_t(0), int64_t(1)}) {
    const std::vector<float> ref = run_one(dir, g.tokens, chunk);
    for (int R : {2, 3, 4, 8}) {
      std::vector<RankRun> runs = run_ep(dir, R, g.tokens, chunk);
      for (int r = 0; r < R; ++r)
        expect_bit_equal(runs[size_t(r)].logits, ref,
                         GetParam() + " R=" + std::to_string(R) + " rank " + std::to_string(r) + " chunk " +
                             std::to_string(chunk));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, EpGolden,
                         ::testing::Values("golden/hf_mixed_yarn", "golden/release_real_ratios", "golden/hf_hca_window",
                                           "golden/hf_text", "golden_quant_nvfp4", "golden_quant_release"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (char& ch : s)
                             if (ch == '/') ch = '_';
                           return s;
                         });

// Every token routed to experts 6 and 7 (both owned by the last rank of 4): the
// other ranks receive no pairs, one rank runs them all; still bit-exact.
TEST(EpRouting, AllTokensOnOneRank) {
  const std::string dir = kData + "/golden/release_real_ratios";  // hash and score layers
  test::Expected g = test::read_expected(dir);
  const int R = 4;
  auto probe = config_load(dir);
  ASSERT_EQ(probe.n_routed_experts, 8);
  ASSERT_EQ(probe.n_experts_per_tok, 2);
  const std::vector<float> ref = run_one(dir, g.tokens, 0, 6);
  std::vector<RankRun> runs = run_ep(dir, R, g.tokens, 0, 6);
  const int64_t pairs = int64_t(g.tokens.size()) * probe.n_experts_per_tok;
  for (int r = 0; r < R; ++r) {
    expect_bit_equal(runs[size_t(r)].logits, ref, "rank " + std::to_string(r));
    int64_t got = 0;
    for (int32_t v : runs[size_t(r)].recv_pairs) got += v;
    EXPECT_EQ(got, r == R - 1 ? pairs : 0) << "rank " << r;
  }
  // And the routing change is real: the logits differ from the fixture's own routing.
  const std::vector<float> normal = run_one(dir, g.tokens, 0);
  EXPECT_NE(std::memcmp(normal.data(), ref.data(), ref.size() * 4), 0);
}

// Data-parallel attention: each rank steps its own sequence (the fixture's tokens
// from offset r, so every rank has a different prefill length), one prefill then
// 4 single-token decode steps, and gets the logits one rank gives that sequence.
TEST(EpDataParallel, EachRankItsOwnSequence) {
  const std::string dir = kData + "/golden/release_real_ratios";
  test::Expected g = test::read_expected(dir);
  const int64_t T = int64_t(g.tokens.size()), decode = 4;
  auto ref_model = model_load(dir);
  const int64_t V = ref_model->config.vocab_size;
  for (int R : {2, 4}) {
    ASSERT_GT(T - R - decode, 1);
    std::vector<std::vector<float>> got(static_cast<size_t>(R));
    test::run_ranks(R, [&](Comm& comm) {
      const int r = comm.rank();
      auto m = test::load_rank(dir, r, R);
      BackendOptions opt;
      opt.ep_comm = &comm;
      opt.ep_data_parallel = true;
      CpuBackend be(*m, opt);
      be.reserve(CacheShape{1, int32_t(T), T});
      const int32_t* toks = g.tokens.data() + r;
      const int64_t n0 = T - r - decode;
      std::vector<float> a = test::feed_chunks(be, 0, toks, n0, 0, V);
      std::vector<float> b = test::feed_chunks(be, 0, toks + n0, decode, 1, V);
      a.insert(a.end(), b.begin(), b.end());
      got[size_t(r)] = std::move(a);
    });
    for (int r = 0; r < R; ++r) {
      auto be = test::reserved_backend(*ref_model, Device::CPU, 1, int32_t(T), T);
      const int32_t* toks = g.tokens.data() + r;
      const int64_t n0 = T - r - decode;
      std::vector<float> want = test::feed_chunks(*be, 0, toks, n0, 0, V);
      std::vector<float> b = test::feed_chunks(*be, 0, toks + n0, decode, 1, V);
      want.insert(want.end(), b.begin(), b.end());
      expect_bit_equal(got[size_t(r)], want, "data parallel R=" + std::to_string(R) + " rank " + std::to_string(r));
    }
  }
}

// Three experts per token over 2, 3 and 4 ranks: the routed sum is still added
// in ascending expert id order, so the logits stay bit-identical to one rank.
TEST(EpRouting, ThreeExpertsPerToken) {
  const std::string dir = kData + "/golden/release_real_ratios";  // hash and score layers
  test::Expected g = test::read_expected(dir);
  for (int64_t chunk : {int64_t(0), int64_t(5)}) {
    const std::vector<float> ref = run_one(dir, g.tokens, chunk, -1, true);
    EXPECT_NE(std::memcmp(ref.data(), run_one(dir, g.tokens, chunk).data(), ref.size() * 4), 0);
    for (int R : {2, 3, 4}) {
      std::vector<RankRun> runs = run_ep(dir, R, g.tokens, chunk, -1, true);
      for (int r = 0; r < R; ++r)
        expect_bit_equal(runs[size_t(r)].logits, ref, "K=3 R=" + std::to_string(R) + " rank " + std::to_string(r));
    }
  }
}

// Rank r's model holds only experts [r·E/R, (r+1)·E/R); the rest are empty and
// the shared expert and attention are loaded on every rank.
TEST(EpWeights, RankHoldsOnlyItsExperts) {
  const std::string dir = kData + "/golden_quant_nvfp4";
  const int R = 3;
  for (int r = 0; r < R; ++r) {
    auto m = test::load_rank(dir, r, R);
    const int64_t E = m->config.n_routed_experts, e0 = expert_first(E, r, R), e1 = expert_first(E, r + 1, R);
    EXPECT_EQ(m->weights.experts_first, e0);
    EXPECT_EQ(m->weights.experts_end, e1);
    for (const LayerWeights& lw : m->weights.layers) {
      ASSERT_EQ(int64_t(lw.experts.size()), E);
      for (int64_t e = 0; e < E; ++e) {
        const bool mine = e >= e0 && e < e1;
        for (const LinearWeight* w : {&lw.experts[size_t(e)].w1, &lw.experts[size_t(e)].w2, &lw.experts[size_t(e)].w3}) {
          EXPECT_EQ(w->data != nullptr, mine) << "rank " << r << " expert " << e;
          EXPECT_EQ(w->out_features > 0, mine) << "rank " << r << " expert " << e;
        }
      }
      EXPECT_NE(lw.wq_a.data, nullptr);
      if (lw.has_shared) {
        EXPECT_NE(lw.shared.w1.data, nullptr);
      }
    }
  }
}

// A model loaded with some experts cannot run as a single rank, nor as the wrong rank.
TEST(EpWeights, RangeMismatchIsAnError) {
  const std::string dir = kData + "/golden/hf_text";
  auto part = test::load_rank(dir, 0, 2);
  try {
    CpuBackend be(*part, BackendOptions{});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 0 of 1 runs routed experts [0, 8) but its model loaded [0, 4)"),
              std::string::npos)
        << e.what();
  }
  LoadOptions bad;
  bad.experts = ExpertRange{6, 3};
  EXPECT_THROW(model_load(dir, bad), Error);
}

}  // namespace
