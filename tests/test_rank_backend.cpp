// LeaderBackend / run_follower (engine/rank_backend.h). 1) R simulated ranks of
// expert parallelism where only rank 0 makes calls — reserve, prefill in
// chunks, copy_slot, two-slot decode, reset_slot, a refill, a keepalive, and an
// invalid batch in the middle (out-of-vocabulary token: rank 0's caller gets
// the error, the followers drop it and go on) — give rank 0 the logits of one
// rank making the same calls, bit for bit; the followers return when the leader
// is destroyed. 2) The server's scheduler (runtime::Engine) over a LeaderBackend
// of 2 and 3 ranks generates, for several concurrent requests (greedy and
// sampled, chunked prefill), the tokens it generates on one rank.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>

#include "common/error.h"
#include "factory/leader_backend.h"
#include "backend/cpu/cpu_backend.h"
#include "model/model.h"
#include "rank_util.h"
#include "runtime/engine.h"
#include "step_util.h"
#include "tokenizer/tokenizer.h"

using namespace cm;

namespace {

// R ranks of expert parallelism over the model in dir: rank 0 hands its LeaderBackend to lead, the
// others run run_follower until it is destroyed.
void led_ranks(const std::string& dir, int R, const std::function<void(ModelBackend&)>& lead) {
  test::run_ranks(R, [&](Comm& comm) {
    auto m = test::load_rank(dir, comm.rank(), R);
    BackendOptions opt;
    opt.ep_comm = &comm;
    CpuBackend be(*m, opt);
    if (comm.rank() == 0) {
      LeaderBackend l(be, comm);
      lead(l);
    } else {
      run_follower(be, comm, m->config.vocab_size);
    }
  });
}

// The call sequence, on any backend; returns every logits row it received, in order.
std::vector<float> script(ModelBackend& be, const std::vector<int32_t>& toks, int64_t V, int* errors) {
  std::vector<float> all;
  be.reserve(CacheShape{3, 6, int64_t(toks.size()) + 8});
  const auto step = [&](const std::vector<int32_t>& t, const std::vector<int32_t>& p, const std::vector<int32_t>& s) {
    std::vector<uint8_t> w(t.size(), 1);
    std::vector<float> out(t.size() * size_t(V));
    try {
      be.step(Batch{int32_t(t.size()), t.data(), p.data(), s.data(), w.data()}, out.data());
      all.insert(all.end(), out.begin(), out.end());
    } catch (const Error&) {
      ++*errors;
    }
  };
  const int32_t n = int32_t(toks.size()) - 2;  // slot 0 takes all but the last two tokens
  for (int32_t at = 0; at < n; at += 6) {
    std::vector<int32_t> t, p, s;
    for (int32_t i = at; i < std::min(n, at + 6); ++i) t.push_back(toks[size_t(i)]), p.push_back(i), s.push_back(0);
    step(t, p, s);
  }
  be.copy_slot(0, 1);
  step({toks[size_t(n)], toks[size_t(n + 1)]}, {n, n}, {0, 1});  // both slots decode
  step({int32_t(V) + 5}, {n + 1}, {0});                         // out of vocabulary: refused everywhere
  step({toks[0]}, {n + 1}, {1});
  be.reset_slot(1);
  if (auto* lead = dynamic_cast<LeaderBackend*>(&be)) lead->keepalive();
  step({toks[2], toks[3], toks[4]}, {0, 1, 2}, {1, 1, 1});
  return all;
}

TEST(RankBackend, FollowersRepeatRankZerosCallsBitExact) {
  const std::string dir = std::string(CLAWMINE_TEST_DATA) + "/golden/hf_text";
  const test::Expected g = test::read_expected(dir);
  const int64_t V = config_load(dir).vocab_size;
  auto one = model_load(dir);
  CpuBackend ref_be(*one, BackendOptions{});
  int ref_errors = 0;
  const std::vector<float> ref = script(ref_be, g.tokens, V, &ref_errors);
  ASSERT_EQ(ref_errors, 1);
  for (int R : {2, 3, 4}) {
    std::vector<float> got;
    int errors = 0;
    led_ranks(dir, R, [&](ModelBackend& lead) { got = script(lead, g.tokens, V, &errors); });
    EXPECT_EQ(errors, 1) << "R=" << R;
    ASSERT_EQ(got.size(), ref.size()) << "R=" << R;
    EXPECT_EQ(std::memcmp(got.data(), ref.data(), got.size() * 4), 0) << "R=" << R;
  }
}

TEST(RankBackend, WrongRanksAreRefused) {
  test::run_ranks(2, [&](Comm& comm) {
    auto m = model_load(std::string(CLAWMINE_TEST_DATA) + "/golden/hf_text");
    CpuBackend be(*m, BackendOptions{});
    if (comm.rank() == 1) {
      EXPECT_THROW(LeaderBackend(be, comm), Error);
    } else {
      EXPECT_THROW(run_follower(be, comm, m->config.vocab_size), Error);
    }
  });
}

}  // namespace

namespace {

// Runs five requests through a runtime::Engine on `be`; returns each request's generated ids.
std::vector<std::vector<int32_t>> serve_jobs(ModelBackend& be, int64_t V) {
  static const Tokenizer tok = Tokenizer::load(std::string(CLAWMINE_TEST_DATA) + "/tokenizer");
  runtime::EngineOptions o;
  o.max_seqs = 3;
  o.max_step_tokens = 8;
  o.ctx = 48;
  runtime::Engine e(be, &tok, V, o, nullptr);
  std::vector<std::shared_ptr<runtime::Job>> jobs;
  for (int r = 0; r < 5; ++r) {
    runtime::JobSpec s;
    s.id = "r" + std::to_string(r);
    for (int i = 0; i < 9 + 4 * r; ++i) s.prompt.push_back(int32_t(3 + (i * 37 + r * 11) % (V - 3)));
    s.max_tokens = 6;
    s.ignore_eos = true;
    s.sampling.temperature = r % 2 ? 0.9f : 0.f;
    s.sampling.seed = 40 + uint64_t(r);
    jobs.push_back(std::make_shared<runtime::Job>(std::move(s)));
    e.submit(jobs.back());
  }
  for (int i = 0; i < 1000 && e.step_once(); ++i) {
  }
  std::vector<std::vector<int32_t>> out;
  for (auto& j : jobs) {
    std::vector<int32_t> ids;
    for (const runtime::JobEvent& ev : j->pop(0))
      for (const runtime::TokenOut& t : ev.tokens) ids.push_back(t.id);
    out.push_back(ids);
  }
  return out;
}

TEST(RankBackend, ServerSchedulerOverRanksGeneratesOneRanksTokens) {
  const std::string dir = std::string(CLAWMINE_TEST_DATA) + "/golden/hf_text";
  const int64_t V = config_load(dir).vocab_size;
  auto one = model_load(dir);
  CpuBackend ref_be(*one, BackendOptions{});
  const std::vector<std::vector<int32_t>> ref = serve_jobs(ref_be, V);
  for (const auto& ids : ref) ASSERT_EQ(ids.size(), 6u);
  for (int R : {2, 3}) {
    std::vector<std::vector<int32_t>> got;
    led_ranks(dir, R, [&](ModelBackend& lead) { got = serve_jobs(lead, V); });
    EXPECT_EQ(got, ref) << "R=" << R;
  }
}

}  // namespace
