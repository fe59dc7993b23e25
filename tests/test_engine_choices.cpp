// The engine's shared-prompt choices (JobSpec::forks / fork_of: a request's n and best_of) and
// prompt logprobs (echo + logprobs), on the default model: a fork gives exactly the tokens its job
// gives alone, copies the prompt's state instead of prefilling it (cached_tokens), and choices
// beyond the free slots queue without deadlock; prompt logprobs equal the logprobs the same tokens
// get when they are generated.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "factory/factory.h"
#include "model/model.h"
#include "runtime/engine.h"
#include "runtime/stop_rule.h"
#include "sampling/generation_config.h"
#include "tokenizer/tokenizer.h"

using namespace cm;
using namespace cm::runtime;

namespace {
const std::string kDefault = std::string(CLAWMINE_TEST_DATA) + "/../../models/default";

struct Fixture {
  std::unique_ptr<Model> m = model_load(kDefault);
  Tokenizer tok = Tokenizer::load(kDefault);
  EngineOptions opt(int32_t max_seqs) const {
    EngineOptions o;
    o.max_seqs = max_seqs;
    o.max_step_tokens = 64;
    o.ctx = 256;
    o.eos_ids = end_of_sequence_ids(m->config, &tok, load_generation_config(kDefault));
    return o;
  }
};

JobSpec spec_of(const Tokenizer& tok, float temperature, uint64_t seed) {
  JobSpec s;
  s.prompt = tok.encode("Once upon a time in a land far away, there lived");
  s.max_tokens = 12;
  s.ignore_eos = true;
  s.sampling.temperature = temperature;
  s.sampling.seed = seed;
  return s;
}

struct Result {
  std::vector<int32_t> ids;
  std::vector<float> logprobs;
  std::vector<TokenOut> prompt_lp;
  JobEvent fin;
};

Result collect(Job& j) {
  Result r;
  for (JobEvent& e : j.pop(0)) {
    for (const TokenOut& t : e.tokens) r.ids.push_back(t.id), r.logprobs.push_back(t.logprob);
    if (!e.prompt_logprobs.empty()) r.prompt_lp = e.prompt_logprobs;
    if (e.kind == JobEvent::Finish) r.fin = e;
  }
  return r;
}

// The job alone on a fresh engine.
Result alone(Fixture& f, const JobSpec& spec) {
  auto be = make_backend(*f.m, Device::CPU);
  Engine e(*be, &f.tok, f.m->config.vocab_size, f.opt(1), nullptr);
  Result r;
  r.fin = e.generate(spec, [&](const JobEvent& ev) {
    for (const TokenOut& t : ev.tokens) r.ids.push_back(t.id), r.logprobs.push_back(t.logprob);
    if (!ev.prompt_logprobs.empty()) r.prompt_lp = ev.prompt_logprobs;
  });
  return r;
}

// n jobs of one prompt (seeds 100 + i), the first forked by the others, on max_seqs slots.
std::vector<Result> choices(Fixture& f, int n, int32_t max_seqs, float temperature) {
  auto be = make_backend(*f.m, Device::CPU);
  Engine e(*be, &f.tok, f.m->config.vocab_size, f.opt(max_seqs), nullptr);
  std::vector<std::shared_ptr<Job>> jobs;
  for (int i = 0; i < n; ++i) {
    JobSpec s = spec_of(f.tok, temperature, 100 + uint64_t(i));
    if (i == 0) s.forks = n - 1;
    else s.fork_of = jobs[0];
    jobs.push_back(std::make_shared<Job>(s));
  }
  e.submit(jobs);
  for (int i = 0; i < 2000 && e.step_once(); ++i) {
  }
  EXPECT_TRUE(e.idle());
  std::vector<Result> out;
  for (auto& j : jobs) out.push_back(collect(*j));
  return out;
}
}  // namespace

TEST(EngineChoices, ForksCopyThePromptAndSampleAsIfAlone) {
  Fixture f;
  const int64_t len = int64_t(spec_of(f.tok, 0, 0).prompt.size());
  std::vector<Result> r = choices(f, 3, 4, 1.0f);
  ASSERT_EQ(r.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(r[size_t(i)].fin.finish_reason, "length") << i;
    EXPECT_EQ(r[size_t(i)].ids, alone(f, spec_of(f.tok, 1.0f, 100 + uint64_t(i))).ids) << "choice " << i;
  }
  EXPECT_EQ(r[0].fin.cached_tokens, 0);
  EXPECT_EQ(r[1].fin.cached_tokens, len - 1);  // the prompt but its last token came from the copy
  EXPECT_EQ(r[2].fin.cached_tokens, len - 1);
  EXPECT_NE(r[0].ids, r[1].ids);  // different seeds, different choices
  EXPECT_NE(r[1].ids, r[2].ids);

  std::vector<Result> g = choices(f, 3, 4, 0.0f);
  EXPECT_EQ(g[0].ids, g[1].ids);
  EXPECT_EQ(g[0].ids, g[2].ids);
}

TEST(EngineChoices, MoreChoicesThanSlotsQueue) {
  Fixture f;
  std::vector<Result> r = choices(f, 5, 2, 1.0f);
  ASSERT_EQ(r.size(), 5u);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(r[size_t(i)].ids.size(), 12u) << i;
    EXPECT_EQ(r[size_t(i)].ids, alone(f, spec_of(f.tok, 1.0f, 100 + uint64_t(i))).ids) << "choice " << i;
  }
  EXPECT_GT(r[1].fin.cached_tokens, 0);  // the one that found a free slot forked
}

// Prompt logprobs: the prompt is a greedy run's prompt + its first tokens, so its last positions'
// logprobs are those the run reported for them; the first has none. The prompt is longer than
// kPromptRows and than a step, so rows are spread over steps.
TEST(EngineChoices, PromptLogprobsMatchGeneratedLogprobs) {
  Fixture f;
  JobSpec g = spec_of(f.tok, 0.0f, 0);
  std::vector<int32_t> base = g.prompt;
  for (int i = 0; i < 8; ++i) g.prompt.insert(g.prompt.end(), base.begin(), base.end());  // ~100 tokens
  g.logprobs = 0;
  Result run = alone(f, g);
  ASSERT_EQ(run.ids.size(), 12u);
  EXPECT_TRUE(run.prompt_lp.empty());

  JobSpec echo = g;
  echo.prompt.insert(echo.prompt.end(), run.ids.begin(), run.ids.begin() + 6);
  echo.prompt_logprobs = true;
  echo.logprobs = 2;
  echo.max_tokens = 2;
  Result e = alone(f, echo);
  ASSERT_EQ(e.prompt_lp.size(), echo.prompt.size());
  EXPECT_TRUE(std::isnan(e.prompt_lp[0].logprob));
  EXPECT_TRUE(e.prompt_lp[0].top.empty());
  for (size_t i = 0; i < e.prompt_lp.size(); ++i) {
    EXPECT_EQ(e.prompt_lp[i].id, echo.prompt[i]);
    if (i == 0) continue;
    EXPECT_LE(e.prompt_lp[i].logprob, 0.0f);
    ASSERT_EQ(e.prompt_lp[i].top.size(), 2u);
    EXPECT_GE(e.prompt_lp[i].top[0].logprob, e.prompt_lp[i].logprob - 1e-6f);
  }
  const size_t first_gen = g.prompt.size();
  for (size_t k = 0; k < 6; ++k)
    EXPECT_NEAR(e.prompt_lp[first_gen + k].logprob, run.logprobs[k], 1e-3) << k;
  // The tokens after the prompt continue the greedy run.
  EXPECT_EQ(e.ids[0], run.ids[6]);
}
