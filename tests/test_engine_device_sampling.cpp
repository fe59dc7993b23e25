// The engine drawing tokens where the logits are (EngineOptions::sample_on_device, through
// ModelBackend::sample_last_step; the CPU backend implements it over its own memory): the same jobs
// give the same tokens, finish reasons and texts as when the engine samples the logits it got back,
// for greedy and seeded sampling, top-k/top-p/min-p, penalties, logit bias, EOS banned under
// min_tokens and stop strings; logprobs (the chosen token's and up to 20 alternatives) come back with the
// tokens; and the device path is really taken.
#include <gtest/gtest.h>

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

// Forwards every call to the backend it wraps and counts the steps that kept their logits and the
// draws made on the backend.
class CountingBackend : public ModelBackend {
 public:
  explicit CountingBackend(ModelBackend& b) : b_(b) {}
  Device device() const override { return b_.device(); }
  void reserve(const CacheShape& s) override { b_.reserve(s); }
  const CacheShape& shape() const override { return b_.shape(); }
  size_t bytes_per_slot(const CacheShape& s) const override { return b_.bytes_per_slot(s); }
  int64_t slot_pos(int32_t slot) const override { return b_.slot_pos(slot); }
  void reset_slot(int32_t slot) override { b_.reset_slot(slot); }
  void copy_slot(int32_t from, int32_t to) override { b_.copy_slot(from, to); }
  void step(const Batch& batch, float* logits_out) override {
    kept += logits_out == nullptr;
    returned += logits_out != nullptr;
    b_.step(batch, logits_out);
  }
  bool samples_on_device() const override { return b_.samples_on_device(); }
  void sample_last_step(const StepSampling& s) override {
    ++draws;
    b_.sample_last_step(s);
  }
  int kept = 0, returned = 0, draws = 0;

 private:
  ModelBackend& b_;
};

struct Outcome {
  std::vector<int32_t> ids;
  std::vector<TokenOut> lp;  // every token's logprobs
  std::string text, reason;
};

std::vector<JobSpec> mixed_jobs(const Tokenizer& tok, const std::vector<int32_t>& eos, bool with_logprobs) {
  std::vector<JobSpec> specs;
  auto base = [&](const std::string& prompt, int64_t max_tokens) {
    JobSpec s;
    s.prompt = tok.encode(prompt);
    s.max_tokens = max_tokens;
    return s;
  };
  JobSpec greedy = base("Once upon a time", 14);
  greedy.ignore_eos = true;
  specs.push_back(greedy);
  JobSpec hot = base("The little dog", 18);
  hot.sampling.temperature = 0.9f;
  hot.sampling.seed = 7;
  specs.push_back(hot);
  JobSpec nucleus = base("In the morning", 10);
  nucleus.sampling.temperature = 0.7f;
  nucleus.sampling.top_k = 20;
  nucleus.sampling.top_p = 0.85f;
  nucleus.sampling.min_p = 0.02f;
  nucleus.sampling.seed = 11;
  specs.push_back(nucleus);
  JobSpec pen = base("She said that she said that", 16);
  pen.sampling.temperature = 0.5f;
  pen.sampling.seed = 3;
  pen.sampling.repetition_penalty = 1.3f;
  pen.sampling.presence_penalty = 0.4f;
  pen.sampling.frequency_penalty = 0.3f;
  pen.sampling.logit_bias = {{tok.encode(" the")[0], 2.5f}, {tok.encode(".")[0], -4.0f}};
  specs.push_back(pen);
  // EOS is banned until 12 tokens; a heavy EOS bias makes it the choice as soon as it is allowed.
  JobSpec early = base("The end", 30);
  early.min_tokens = 12;
  for (int32_t id : eos) early.sampling.logit_bias.emplace_back(id, 40.0f);
  specs.push_back(early);
  JobSpec stop = base("One, two, three,", 24);
  stop.stop = {" six"};
  specs.push_back(stop);
  if (with_logprobs) {
    JobSpec lp = base("A cat sat", 6);
    lp.logprobs = 2;
    lp.ignore_eos = true;
    specs.push_back(lp);
    JobSpec lp0 = base("The sun", 5);
    lp0.logprobs = 0;
    lp0.sampling.temperature = 0.8f;
    lp0.sampling.seed = 5;
    specs.push_back(lp0);
    JobSpec lp20 = base("Where is", 7);
    lp20.logprobs = 20;
    lp20.sampling.temperature = 1.1f;
    lp20.sampling.seed = 9;
    specs.push_back(lp20);
  }
  return specs;
}

std::vector<Outcome> run(bool on_device, bool with_logprobs, int32_t max_seqs, CountingBackend** seen = nullptr) {
  static std::unique_ptr<Model> m = model_load(kDefault);
  static Tokenizer tok = Tokenizer::load(kDefault);
  auto inner = make_backend(*m, Device::CPU);
  static std::unique_ptr<CountingBackend> counting;
  counting = std::make_unique<CountingBackend>(*inner);
  EngineOptions o;
  o.max_seqs = max_seqs;
  o.max_step_tokens = 16;
  o.ctx = 256;
  o.eos_ids = end_of_sequence_ids(m->config, &tok, load_generation_config(kDefault));
  o.sample_on_device = on_device;
  Engine e(*counting, &tok, m->config.vocab_size, o, nullptr);
  std::vector<std::shared_ptr<Job>> jobs;
  for (JobSpec& s : mixed_jobs(tok, o.eos_ids, with_logprobs)) jobs.push_back(std::make_shared<Job>(s));
  e.submit(jobs);
  for (int i = 0; i < 5000 && e.step_once(); ++i) {
  }
  EXPECT_TRUE(e.idle());
  std::vector<Outcome> out;
  for (auto& j : jobs) {
    Outcome r;
    for (JobEvent& ev : j->pop(0)) {
      for (const TokenOut& t : ev.tokens) r.ids.push_back(t.id), r.lp.push_back(t);
      r.text += ev.text;
      if (ev.kind == JobEvent::Finish) r.reason = ev.finish_reason + (ev.error.empty() ? "" : ": " + ev.error);
    }
    out.push_back(std::move(r));
  }
  if (seen) *seen = counting.get();
  return out;
}

}  // namespace

TEST(EngineDeviceSampling, SameTokensAsSamplingOnTheHost) {
  for (int32_t max_seqs : {1, 3, 8}) {
    CountingBackend* host_be = nullptr;
    const std::vector<Outcome> host = run(false, false, max_seqs, &host_be);
    EXPECT_EQ(host_be->kept, 0);
    EXPECT_EQ(host_be->draws, 0);
    CountingBackend* dev_be = nullptr;
    const std::vector<Outcome> dev = run(true, false, max_seqs, &dev_be);
    EXPECT_GT(dev_be->draws, 10) << "max_seqs " << max_seqs;
    EXPECT_EQ(dev_be->kept, dev_be->draws);
    ASSERT_EQ(host.size(), dev.size());
    for (size_t i = 0; i < host.size(); ++i) {
      EXPECT_EQ(host[i].ids, dev[i].ids) << "job " << i << ", max_seqs " << max_seqs;
      EXPECT_EQ(host[i].text, dev[i].text) << "job " << i;
      EXPECT_EQ(host[i].reason, dev[i].reason) << "job " << i;
      EXPECT_FALSE(host[i].ids.empty()) << "job " << i;
    }
    // The EOS job drew EOS as soon as it was allowed: 12 tokens, then EOS.
    EXPECT_EQ(host[4].ids.size(), 13u) << host[4].reason;
    EXPECT_EQ(host[4].reason, "stop");
  }
}

// Jobs that ask for logprobs draw on the backend too: the same tokens, the same top ids in the same order,
// logprobs within float rounding of the host's (the host sums exp in double over the row it got back).
TEST(EngineDeviceSampling, LogprobsComeBackWithTheTokens) {
  CountingBackend* host_be = nullptr;
  const std::vector<Outcome> host = run(false, true, 8, &host_be);
  EXPECT_EQ(host_be->draws, 0);
  CountingBackend* be = nullptr;
  const std::vector<Outcome> dev = run(true, true, 8, &be);
  EXPECT_GT(be->draws, 10);
  EXPECT_EQ(be->kept, be->draws);
  ASSERT_EQ(host.size(), dev.size());
  size_t with_top = 0;
  for (size_t i = 0; i < host.size(); ++i) {
    ASSERT_EQ(host[i].ids, dev[i].ids) << "job " << i;
    EXPECT_EQ(host[i].text, dev[i].text) << "job " << i;
    for (size_t t = 0; t < host[i].lp.size(); ++t) {
      const TokenOut &h = host[i].lp[t], &d = dev[i].lp[t];
      EXPECT_NEAR(h.logprob, d.logprob, 1e-5) << "job " << i << " token " << t;
      ASSERT_EQ(h.top.size(), d.top.size()) << "job " << i << " token " << t;
      for (size_t k = 0; k < h.top.size(); ++k) {
        EXPECT_EQ(h.top[k].id, d.top[k].id) << "job " << i << " token " << t << " top " << k;
        EXPECT_NEAR(h.top[k].logprob, d.top[k].logprob, 1e-5);
      }
      with_top += !h.top.empty();
    }
  }
  EXPECT_EQ(host[6].lp[0].top.size(), 2u);
  EXPECT_TRUE(host[7].lp[0].top.empty());
  EXPECT_LT(host[7].lp[0].logprob, 0.0f);
  EXPECT_EQ(host[8].lp[0].top.size(), 20u);
  EXPECT_GE(with_top, 13u);
}
