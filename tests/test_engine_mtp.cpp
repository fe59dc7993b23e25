// The engine's speculative decoding (EngineOptions::mtp_draft, runtime/engine_mtp.cpp): with the
// checkpoint's MTP block drafting, jobs of every kind (greedy, seeded sampling with top-k/top-p,
// penalties, logprobs, stop ids, min_tokens, max_tokens and the context cut short) emit exactly the
// tokens, logprobs and finish reasons they emit without it, side by side with prefill chunks in the
// same steps; drafts that are the model's own continuation are accepted (fewer steps), corrupted ones
// are not; the counters add up; a backend without the block and out-of-range K are errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <random>

#include "common/error.h"
#include "factory/factory.h"
#include "engine_mtp_util.h"
#include "mtp_fixture.h"
#include "runtime/engine.h"
#include "cli_run.h"
#include "step_util.h"

using namespace cm;
using namespace cm::runtime;
using namespace cm::test::mtp;
using cm::test::error_of;
using namespace cm::test::engine_mtp;

namespace {

// Forwards to a backend and drafts from a table of the jobs' true continuations instead of the MTP
// block: each slot's tokens are tracked (steps, rollbacks, copies) to find the job it holds; drafts at
// the positions `corrupt` picks are changed to another token.
class OracleBackend : public ModelBackend {
 public:
  OracleBackend(ModelBackend& b, std::vector<std::vector<int32_t>> seqs, int64_t V)
      : b_(b), seqs_(std::move(seqs)), V_(V) {}
  Device device() const override { return b_.device(); }
  void reserve(const CacheShape& s) override { b_.reserve(s), held_.assign(size_t(s.max_slots), {}); }
  const CacheShape& shape() const override { return b_.shape(); }
  size_t bytes_per_slot(const CacheShape& s) const override { return b_.bytes_per_slot(s); }
  int64_t slot_pos(int32_t slot) const override { return b_.slot_pos(slot); }
  void reset_slot(int32_t slot) override { b_.reset_slot(slot), held_[size_t(slot)].clear(); }
  void copy_slot(int32_t from, int32_t to) override { b_.copy_slot(from, to), held_[size_t(to)] = held_[size_t(from)]; }
  int64_t undo_token_limit() const override { return b_.undo_token_limit(); }
  void rollback_slot(int32_t slot, int64_t pos) override {
    b_.rollback_slot(slot, pos);
    held_[size_t(slot)].resize(size_t(pos));
  }
  bool has_mtp() const override { return true; }
  void step(const Batch& b, float* logits_out) override {
    b_.step(b, logits_out);
    for (int32_t i = 0; i < b.n; ++i) held_[size_t(b.slot[i])].push_back(b.token[i]);
  }
  void draft(const DraftRequest& r) override {
    for (int32_t i = 0; i < r.n; ++i) {
      std::vector<int32_t> h = held_[size_t(r.slot[i])];
      h.push_back(r.token[i]);
      const std::vector<int32_t>* seq = nullptr;
      for (const auto& s : seqs_)
        if (s.size() >= h.size() && std::equal(h.begin(), h.end(), s.begin())) seq = &s;
      for (int32_t j = 0; j < r.k; ++j) {
        const size_t at = h.size() + size_t(j);
        int32_t d = seq && at < seq->size() ? (*seq)[at] : 0;
        if (corrupt && corrupt(int64_t(at))) d = int32_t((d + 1) % V_);
        r.out[i * r.k + j] = d;
      }
      ++drafts;
    }
  }
  std::function<bool(int64_t)> corrupt;
  int drafts = 0;

 private:
  ModelBackend& b_;
  std::vector<std::vector<int32_t>> seqs_;
  int64_t V_;
  std::vector<std::vector<int32_t>> held_;
};

class CountingMetrics : public EngineMetrics {
 public:
  void set_queue(int64_t, int64_t) override {}
  void add_prompt_tokens(int64_t) override {}
  void add_generation_tokens(int64_t n) override { generated += n; }
  void observe_ttft(double) override {}
  void observe_inter_token(double) override {}
  void observe_e2e(double) override {}
  void request_finished(const std::string&) override {}
  void prefix_cache(int64_t, int64_t) override {}
  void spec_decode(int64_t d, int64_t a) override { ++rounds, drafted += d, accepted += a; }
  void engine_step(int64_t tokens, double backend, double sample, double engine) override {
    ++steps, step_tokens += tokens;
    timed_ok = timed_ok && backend >= 0 && sample >= 0 && engine >= 0;
  }
  int64_t generated = 0, rounds = 0, drafted = 0, accepted = 0, steps = 0, step_tokens = 0;
  bool timed_ok = true;
};

}  // namespace

// The MTP block drafting: every job's tokens, logprobs and finish reason are those it has without MTP.
TEST(EngineMtp, SameTokensAsWithout) {
  auto m = mtp_model();
  const int64_t V = m->config.vocab_size, ctx = 96;
  const std::vector<JobSpec> specs = mixed_jobs(V, ctx);
  auto plain_be = make_backend(*m, Device::CPU);
  Engine plain(*plain_be, nullptr, V, options(0, ctx), nullptr);
  const std::vector<Outcome> want_host = run_jobs(plain, specs);
  // The backend's draw gives the host's tokens; its logprobs are the sampler's (f32), so the runs that
  // sample on the backend compare with a plain run that does too.
  auto dev_be = make_backend(*m, Device::CPU);
  EngineOptions dev_opt = options(0, ctx);
  dev_opt.sample_on_device = true;
  Engine plain_dev(*dev_be, nullptr, V, dev_opt, nullptr);
  const std::vector<Outcome> want_dev = run_jobs(plain_dev, specs);
  for (size_t i = 0; i < specs.size(); ++i) EXPECT_EQ(want_dev[i].ids, want_host[i].ids) << "job " << i;
  // k < 0: K = |k| with the rows drawn by the backend (sample_last_step: the verify rows' draw counters,
  // penalty counts and min_tokens bans as if the drafts before them were accepted).
  for (int32_t k : {1, 3, 7, -3, -7}) {
    auto be = make_backend(*m, Device::CPU);
    CountingMetrics metrics;
    EngineOptions eo = options(std::abs(k), ctx);
    eo.sample_on_device = k < 0;
    Engine e(*be, nullptr, V, eo, &metrics);
    const std::vector<Outcome> got = run_jobs(e, specs);
    const std::vector<Outcome>& want = k < 0 ? want_dev : want_host;
    for (size_t i = 0; i < specs.size(); ++i)
      EXPECT_TRUE(got[i] == want[i]) << "--mtp " << k << " job " << i << ": " << got[i].ids.size() << " tokens ("
                                     << got[i].reason << ") vs " << want[i].ids.size() << " (" << want[i].reason << ")";
    const SpecStats& st = e.spec_stats();
    EXPECT_GT(st.rounds, 20) << "--mtp " << k;
    if (std::abs(k) > 1) EXPECT_GT(st.drafted, st.rounds);
    EXPECT_EQ(metrics.rounds, st.rounds);
    EXPECT_EQ(metrics.drafted, st.drafted);
    EXPECT_EQ(metrics.accepted, st.accepted);
    // Every step that ran reports its timing (the steps with jobs to run: no more than the engine counted).
    EXPECT_GT(metrics.steps, 20);
    EXPECT_LE(metrics.steps, st.steps);
    EXPECT_GE(metrics.step_tokens, st.emitted) << "a step's rows include each token it emitted";
    EXPECT_TRUE(metrics.timed_ok);
    int64_t by_pos = 0;
    for (int64_t a : st.accepted_at) by_pos += a;
    EXPECT_EQ(by_pos, st.accepted);
    std::printf("  --mtp %d: %lld rounds, %lld of %lld drafts accepted, %lld tokens in %lld steps\n", k,
                (long long)st.rounds, (long long)st.accepted, (long long)st.drafted, (long long)st.emitted,
                (long long)st.steps);
  }
}

// Drafts that are the jobs' own continuations are all accepted (k + 1 tokens a round), corrupted ones
// end their round at the corruption; the tokens never change.
TEST(EngineMtp, AcceptsTheModelsOwnContinuation) {
  auto m = model_load(std::string(CLAWMINE_TEST_DATA) + "/golden/release_real_ratios");
  const int64_t V = m->config.vocab_size, ctx = 96;
  const std::vector<JobSpec> specs = mixed_jobs(V, ctx);
  auto plain_be = make_backend(*m, Device::CPU);
  Engine plain(*plain_be, nullptr, V, options(0, ctx), nullptr);
  const std::vector<Outcome> want = run_jobs(plain, specs);
  std::vector<std::vector<int32_t>> seqs;
  for (size_t i = 0; i < specs.size(); ++i) {
    seqs.push_back(specs[i].prompt);
    seqs.back().insert(seqs.back().end(), want[i].ids.begin(), want[i].ids.end());
  }
  for (bool corrupt : {false, true}) {
    auto inner = make_backend(*m, Device::CPU);
    OracleBackend be(*inner, seqs, V);
    // Every third position: each round of 4 drafts meets one within its first 3, so at most 2 are accepted.
    if (corrupt) be.corrupt = [](int64_t pos) { return pos % 3 == 0; };
    const int32_t K = 4;
    Engine e(be, nullptr, V, options(K, ctx), nullptr);
    const std::vector<Outcome> got = run_jobs(e, specs);
    for (size_t i = 0; i < specs.size(); ++i)
      EXPECT_TRUE(got[i] == want[i]) << (corrupt ? "corrupted" : "exact") << " drafts, job " << i;
    const SpecStats& st = e.spec_stats();
    EXPECT_EQ(st.rounds, be.drafts);
    for (int32_t j = 0; j + 1 < K; ++j) EXPECT_GE(st.accepted_at[j], st.accepted_at[j + 1]);  // a prefix is accepted
    if (!corrupt) {
      // Every draft is accepted unless its job ended on it (a stop id, max_tokens or the context).
      EXPECT_GE(st.accepted, st.drafted - int64_t(specs.size()) * K) << st.accepted << " of " << st.drafted;
      EXPECT_GT(double(st.emitted) / double(st.rounds), 3.0);
    } else {
      EXPECT_LE(2 * st.accepted, st.drafted);
      EXPECT_GT(st.accepted_at[1], 0);  // and some rounds accept 2
      EXPECT_EQ(st.accepted_at[2], 0);
    }
  }
}

TEST(EngineMtp, ErrorsNameTheProblem) {
  auto m = model_load(std::string(CLAWMINE_TEST_DATA) + "/golden/release_real_ratios");
  const int64_t V = m->config.vocab_size;
  auto be = make_backend(*m, Device::CPU);
  EXPECT_NE(error_of([&] { Engine e(*be, nullptr, V, options(3, 64), nullptr); }).find("runs no MTP block"),
            std::string::npos);
  auto mm = mtp_model();
  auto mbe = make_backend(*mm, Device::CPU);
  EXPECT_NE(error_of([&] { Engine e(*mbe, nullptr, V, options(kMaxDraft + 1, 64), nullptr); }).find("outside [0, 7]"),
            std::string::npos);
  EXPECT_NE(error_of([&] { Engine e(*mbe, nullptr, V, options(-1, 64), nullptr); }).find("outside [0, 7]"),
            std::string::npos);
}

// The CLI: `generate --mtp K` (and CLAWMINE_MTP) prints the text it prints without, and what the
// drafts did; a checkpoint without the block and K out of range are one-line errors.
TEST(EngineMtp, CliGenerateWithMtp) {
  const std::string& dir = mtp_checkpoint();
  auto cli = [](std::vector<std::string> args, std::vector<std::string> env = {}) {
    args.insert(args.begin(), CLAWMINE_BINARY);
    cm::test::RunOptions o;
    o.set_env = std::move(env);
    return cm::test::run_program(args, o);
  };
  const std::vector<std::string> base = {"generate", "-m", dir, "--tokens", "5,17,3,9", "-n", "30",
                                         "--temp", "0.9", "--top-k", "50", "-s", "7", "--ignore-eos", "--device", "cpu"};
  const cm::test::RunResult plain = cli(base);
  ASSERT_EQ(plain.code, 0) << plain.err;
  EXPECT_EQ(plain.err.find("mtp:"), std::string::npos);
  auto with = base;
  with.insert(with.end(), {"--mtp", "3"});
  const cm::test::RunResult spec = cli(with);
  ASSERT_EQ(spec.code, 0) << spec.err;
  EXPECT_EQ(spec.out, plain.out);
  EXPECT_NE(spec.err.find("drafts accepted"), std::string::npos) << spec.err;
  const cm::test::RunResult env = cli(base, {"CLAWMINE_MTP=2"});
  ASSERT_EQ(env.code, 0) << env.err;
  EXPECT_EQ(env.out, plain.out);
  EXPECT_NE(env.err.find("drafts accepted"), std::string::npos) << env.err;

  const std::string no_block = std::string(CLAWMINE_TEST_DATA) + "/golden/release_real_ratios";
  const cm::test::RunResult none = cli({"generate", "-m", no_block, "--tokens", "5", "-n", "3", "--mtp", "2"});
  EXPECT_EQ(none.code, 1);
  EXPECT_NE(none.err.find("mtp"), std::string::npos) << none.err;
  EXPECT_EQ(std::count(none.err.begin(), none.err.end(), '\n'), 1) << none.err;
  const cm::test::RunResult big = cli({"generate", "-m", dir, "--tokens", "5", "-n", "3", "--mtp", "8"});
  EXPECT_NE(big.code, 0);
  EXPECT_NE(big.err.find("--mtp"), std::string::npos) << big.err;
}
