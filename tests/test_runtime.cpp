// The runtime room: the stop rule (when a generation ends and what text it releases) and
// Engine::generate, the caller's-thread run of a job that the CLI uses, on the default model.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "factory/factory.h"
#include "model/model.h"
#include "runtime/engine.h"
#include "runtime/row_sampler.h"
#include "runtime/stop_rule.h"
#include "sampling/generation_config.h"
#include "sampling/sampler.h"
#include "tokenizer/tokenizer.h"

using namespace cm;
using namespace cm::runtime;

namespace {
const std::string kDefault = std::string(CLAWMINE_TEST_DATA) + "/../../models/default";

const Tokenizer& tokenizer() {
  static Tokenizer t = Tokenizer::load(std::string(CLAWMINE_TEST_DATA) + "/tokenizer");
  return t;
}

StopParams params(int64_t max_tokens) {
  StopParams p;
  p.eos_ids = {1};
  p.max_tokens = max_tokens;
  return p;
}

// Token ids whose text is `s`, one per byte-ish piece, so stop strings can span tokens.
std::vector<int32_t> ids_of(const std::string& s) { return tokenizer().encode(s); }

// Feeds ids until the rule says done; returns the released text (finish() included).
std::string run(StopRule& r, const std::vector<int32_t>& ids, StopVerdict* last = nullptr) {
  std::string out;
  for (int32_t id : ids) {
    StopVerdict v = r.on_token(id);
    out += v.text;
    if (v.done) {
      out += r.finish();
      if (last) *last = v;
      return out;
    }
  }
  return out + r.finish();
}
}  // namespace

TEST(StopRule, EndOfSequenceIdsFromConfigTokenizerAndGenerationConfig) {
  Config c;
  c.eos_token_ids = {7};
  GenerationDefaults gd;
  gd.eos_ids = {9};
  std::vector<int32_t> with = end_of_sequence_ids(c, &tokenizer(), gd);
  EXPECT_EQ(with.front(), 7);
  EXPECT_EQ(with.back(), 9);
  EXPECT_EQ(with.size(), tokenizer().eos_id() >= 0 ? 3u : 2u);
  EXPECT_EQ(end_of_sequence_ids(c, nullptr, gd), (std::vector<int32_t>{7, 9}));
}

TEST(StopRule, EosEndsWithStopAndIsNotText) {
  StopRule r(params(10), &tokenizer(), 3);
  EXPECT_FALSE(r.on_token(ids_of("a")[0]).done);
  StopVerdict v = r.on_token(1);
  EXPECT_TRUE(v.done);
  EXPECT_TRUE(v.eos);
  EXPECT_EQ(v.reason, "stop");
  EXPECT_EQ(v.text, "");
}

TEST(StopRule, IgnoreEosMakesEosAnOrdinaryToken) {
  StopParams p = params(3);
  p.ignore_eos = true;
  StopRule r(p, nullptr, 1);
  EXPECT_FALSE(r.on_token(1).done);
  EXPECT_FALSE(r.on_token(1).done);
  StopVerdict v = r.on_token(1);
  EXPECT_TRUE(v.done);
  EXPECT_EQ(v.reason, "length");
}

TEST(StopRule, MaxTokensEndsWithLength) {
  StopRule r(params(2), nullptr, 5);
  EXPECT_FALSE(r.on_token(4).done);
  StopVerdict v = r.on_token(4);
  EXPECT_TRUE(v.done);
  EXPECT_FALSE(v.eos);
  EXPECT_EQ(v.reason, "length");
}

TEST(StopRule, ContextEndEndsWithLength) {
  // Prompt of 6 in a context of 8: tokens 1 and 2 are fed at positions 6 and 7; token 3 is
  // sampled from position 7's logits and cannot be fed.
  StopParams p = params(100);
  p.ctx = 8;
  StopRule r(p, nullptr, 6);
  EXPECT_FALSE(r.on_token(4).done);
  EXPECT_FALSE(r.on_token(4).done);
  StopVerdict v = r.on_token(4);
  EXPECT_TRUE(v.done);
  EXPECT_EQ(v.reason, "length");
}

TEST(StopRule, StopStringHeldBackAcrossTokensAndNotOutput) {
  StopParams p = params(100);
  p.stop = {"lo wo"};
  StopRule r(p, &tokenizer(), 1);
  StopVerdict last;
  std::string out = run(r, ids_of("hello world"), &last);
  EXPECT_EQ(out, "hel");
  EXPECT_EQ(last.reason, "stop");
  EXPECT_FALSE(last.eos);
  EXPECT_TRUE(r.stopped_by_string());
}

TEST(StopRule, HeldTextIsReleasedWhenNoStopStringCompletes) {
  StopParams p = params(100);
  p.stop = {"ld!"};
  StopRule r(p, &tokenizer(), 1);
  std::string streamed;
  for (int32_t id : ids_of("hello world")) streamed += r.on_token(id).text;
  EXPECT_EQ(streamed, "hello wor");  // "ld" might still become "ld!"
  EXPECT_EQ(streamed + r.finish(), "hello world");
}

TEST(StopRule, StopTokenIdsEndEvenWithIgnoreEos) {
  StopParams p = params(100);
  p.ignore_eos = true;
  p.stop_token_ids = {42};
  StopRule r(p, &tokenizer(), 1);
  EXPECT_FALSE(r.on_token(1).done);
  StopVerdict v = r.on_token(42);
  EXPECT_TRUE(v.done);
  EXPECT_TRUE(v.eos);
  EXPECT_EQ(v.reason, "stop");
}

TEST(StopRule, MinTokensBansEosAndStopIdsUntilReached) {
  StopParams p = params(100);
  p.stop_token_ids = {42};
  p.min_tokens = 2;
  StopRule r(p, nullptr, 1);
  EXPECT_EQ(r.banned(), (std::vector<int32_t>{1, 42}));
  // Greedy sampling over logits where EOS is the best token: the ban moves it to the runner-up.
  std::vector<float> logits(64, 0.f);
  logits[1] = 5.f;
  logits[3] = 1.f;
  RowSampler s(SamplingParams{}, {});
  EXPECT_EQ(s.sample(logits.data(), 64, 0, r.banned()), 3);
  EXPECT_FALSE(r.on_token(3).done);
  EXPECT_FALSE(r.on_token(1).done);  // an EOS not banned by the caller is an ordinary token
  EXPECT_TRUE(r.banned().empty());
  EXPECT_EQ(s.sample(logits.data(), 64, 1, r.banned()), 1);
  EXPECT_TRUE(r.on_token(1).done);
}

// Engine::generate on the caller's thread gives the same tokens and text as the same job run by
// the scheduler (submit + step_once), on the default model.
TEST(RuntimeEngine, GenerateMatchesAScheduledJob) {
  auto m = model_load(kDefault);
  Tokenizer tok = Tokenizer::load(kDefault);
  EngineOptions o;
  o.max_seqs = 2;
  o.max_step_tokens = 64;
  o.ctx = 128;
  o.eos_ids = end_of_sequence_ids(m->config, &tok, load_generation_config(kDefault));
  JobSpec spec;
  spec.id = "t";
  spec.prompt = tok.encode("Once upon a time");
  spec.max_tokens = 24;
  spec.sampling.temperature = 0.8f;
  spec.sampling.seed = 5;

  auto be = make_backend(*m, Device::CPU);
  Engine e(*be, &tok, m->config.vocab_size, o, nullptr);
  std::vector<int32_t> a;
  std::string text_a;
  JobEvent fin = e.generate(spec, [&](const JobEvent& ev) {
    for (const TokenOut& t : ev.tokens) a.push_back(t.id);
    text_a += ev.text;
  });
  EXPECT_EQ(fin.kind, JobEvent::Finish);
  EXPECT_EQ(fin.completion_tokens, int64_t(a.size()));
  EXPECT_FALSE(a.empty());

  auto be2 = make_backend(*m, Device::CPU);
  Engine e2(*be2, &tok, m->config.vocab_size, o, nullptr);
  auto job = std::make_shared<Job>(spec);
  e2.submit(job);
  for (int i = 0; i < 1000 && e2.step_once(); ++i) {
  }
  std::vector<int32_t> b;
  std::string text_b;
  for (const JobEvent& ev : job->pop(0)) {
    for (const TokenOut& t : ev.tokens) b.push_back(t.id);
    text_b += ev.text;
  }
  EXPECT_EQ(a, b);
  EXPECT_EQ(text_a, text_b);
  EXPECT_EQ(text_a, tok.decode(std::vector<int32_t>(a.begin(), a.end() - (fin.eos ? 1 : 0))));

  // A second generate reuses the slot's prefix (prompt + every output token but the last, which
  // was never fed); after drop_cached_prefixes nothing is reused.
  JobSpec again = spec;
  again.prompt.insert(again.prompt.end(), a.begin(), a.end());
  EXPECT_GT(e.generate(again, nullptr).cached_tokens, 0);
  e.drop_cached_prefixes();
  EXPECT_EQ(e.generate(again, nullptr).cached_tokens, 0);
}

// A job's stop_token_ids end it where that id is sampled (as EOS: not text); min_tokens keeps
// that id from being sampled before then.
TEST(RuntimeEngine, StopTokenIdsAndMinTokens) {
  auto m = model_load(kDefault);
  Tokenizer tok = Tokenizer::load(kDefault);
  EngineOptions o;
  o.max_seqs = 1;
  o.ctx = 128;
  auto be = make_backend(*m, Device::CPU);
  Engine e(*be, &tok, m->config.vocab_size, o, nullptr);
  JobSpec spec;
  spec.prompt = tok.encode("Once upon a time");
  spec.max_tokens = 16;
  spec.ignore_eos = true;
  auto ids_of_job = [&](const JobSpec& s, JobEvent* fin) {
    std::vector<int32_t> ids;
    *fin = e.generate(s, [&](const JobEvent& ev) {
      for (const TokenOut& t : ev.tokens) ids.push_back(t.id);
    });
    return ids;
  };
  JobEvent fin;
  const std::vector<int32_t> a = ids_of_job(spec, &fin);
  ASSERT_EQ(a.size(), 16u);
  size_t k = 1;  // the first token not seen before it
  while (k < a.size() && std::find(a.begin(), a.begin() + long(k), a[k]) != a.begin() + long(k)) ++k;
  ASSERT_LT(k, a.size());

  JobSpec stop = spec;
  stop.stop_token_ids = {a[k]};
  const std::vector<int32_t> b = ids_of_job(stop, &fin);
  EXPECT_EQ(b, std::vector<int32_t>(a.begin(), a.begin() + long(k) + 1));
  EXPECT_EQ(fin.finish_reason, "stop");
  EXPECT_TRUE(fin.eos);

  stop.min_tokens = int64_t(k) + 1;
  const std::vector<int32_t> c = ids_of_job(stop, &fin);
  ASSERT_GT(c.size(), k);
  EXPECT_NE(c[k], a[k]);
  EXPECT_EQ(std::vector<int32_t>(c.begin(), c.begin() + long(k)), std::vector<int32_t>(a.begin(), a.begin() + long(k)));
}
