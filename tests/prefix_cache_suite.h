// Prefix caching across requests (runtime/engine.h): requests that share a system prompt but not their
// questions reuse its state through a snapshot, and get the tokens and logprobs (bit for bit) they get
// from an empty slot. A suite per device (tests/test_prefix_cache.cpp on the CPU backend,
// tests/gpu/test_prefix_cache_cuda.cpp on CUDA), on the embedded default model.
#pragma once
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <vector>

#include "engine_mtp_util.h"
#include "factory/factory.h"
#include "model/model.h"

namespace prefix_cache_suite {

using namespace cm;
using namespace cm::runtime;
using cm::test::engine_mtp::Outcome;
using cm::test::engine_mtp::run_jobs;

inline const std::string& default_model() {
  static const std::string d = std::string(CLAWMINE_TEST_DATA) + "/../../models/default";
  return d;
}

inline EngineOptions opts(bool caching) {
  EngineOptions o;
  o.max_seqs = 4;
  o.max_step_tokens = 24;  // prompts prefill in chunks; the snapshot point is inside a chunk's span
  o.ctx = 256;
  o.prefix_caching = caching;
  return o;
}

// A 70-token "system prompt" and questions of 9..14 tokens whose first tokens all differ.
struct Prompts {
  std::vector<int32_t> system;
  std::vector<std::vector<int32_t>> full;
  Prompts(int64_t V, int n) {
    std::mt19937 rng(17);
    for (int i = 0; i < 70; ++i) system.push_back(int32_t(rng() % uint32_t(V)));
    for (int q = 0; q < n; ++q) {
      std::vector<int32_t> p = system;
      p.push_back(int32_t(q + 3));  // distinct first question tokens
      for (int i = 0; i < 8 + q % 6; ++i) p.push_back(int32_t(rng() % uint32_t(V)));
      full.push_back(p);
    }
  }
};

inline JobSpec job(const std::vector<int32_t>& prompt, int q) {
  JobSpec s;
  s.prompt = prompt;
  s.max_tokens = 12;
  s.ignore_eos = true;
  s.logprobs = 3;
  if (q % 2) s.sampling.temperature = 0.8f, s.sampling.seed = uint64_t(40 + q), s.sampling.top_k = 50;
  return s;
}

// One job on a fresh engine with prefix caching off: the reference.
inline Outcome alone(ModelBackend& be, int64_t V, const JobSpec& s) {
  Engine e(be, nullptr, V, opts(false), nullptr);
  auto out = run_jobs(e, {s});
  EXPECT_EQ(out[0].cached, 0);
  return out[0];
}

inline void shares_a_system_prompt(Device d) {
  auto m = model_load(default_model());
  const int64_t V = m->config.vocab_size;
  const Prompts p(V, 7);
  auto ref_be = make_backend(*m, d);
  std::vector<Outcome> want;
  for (int q = 0; q < 7; ++q) want.push_back(alone(*ref_be, V, job(p.full[size_t(q)], q)));

  auto be = make_backend(*m, d);
  Engine e(*be, nullptr, V, opts(true), nullptr);
  // One at a time: the first finds nothing; the second shares the system prompt with the first's slot and
  // leaves a snapshot of it; every later one starts from the snapshot (copied, so it stays).
  for (int q = 0; q < 4; ++q) {
    const Outcome got = run_jobs(e, {job(p.full[size_t(q)], q)})[0];
    EXPECT_EQ(got.cached, q < 2 ? 0 : 70) << "request " << q;
    EXPECT_TRUE(got == want[size_t(q)]) << "request " << q << ": not the tokens and logprobs it gets alone";
  }
  // Three at once: each copies the snapshot into a free slot of its own.
  std::vector<JobSpec> three;
  for (int q = 4; q < 7; ++q) three.push_back(job(p.full[size_t(q)], q));
  const std::vector<Outcome> got = run_jobs(e, three);
  for (int q = 4; q < 7; ++q) {
    EXPECT_EQ(got[size_t(q - 4)].cached, 70) << "request " << q;
    EXPECT_TRUE(got[size_t(q - 4)] == want[size_t(q)]) << "request " << q;
  }
  // The next turn of the last conversation (its prompt, its answer, a new message) reuses that request's
  // slot in place: the longer prefix (the answer's last token was never fed).
  std::vector<int32_t> next = p.full[6];
  next.insert(next.end(), got[2].ids.begin(), got[2].ids.end());
  next.push_back(5);
  const Outcome l = run_jobs(e, {job(next, 0)})[0];
  EXPECT_EQ(l.cached, int64_t(p.full[6].size() + got[2].ids.size()) - 1);
  EXPECT_TRUE(l == alone(*ref_be, V, job(next, 0)));
  // drop_cached_prefixes forgets the snapshot with the rest.
  e.drop_cached_prefixes();
  EXPECT_EQ(run_jobs(e, {job(p.full[3], 3)})[0].cached, 0);
}

// Requests with one system prompt arriving together (nothing cached yet): the first computes the system
// prompt, the others wait for it and copy its state, and each still gets the tokens and logprobs it gets
// alone. With `spare` a free slot holds the first's snapshot; without, they copy the first's own slot.
inline void shares_in_flight(Device d, bool spare) {
  auto m = model_load(default_model());
  const int64_t V = m->config.vocab_size;
  const int n = spare ? 3 : 4;  // opts: 4 slots
  const Prompts p(V, n);
  auto ref_be = make_backend(*m, d);
  auto be = make_backend(*m, d);
  Engine e(*be, nullptr, V, opts(true), nullptr);
  std::vector<JobSpec> jobs;
  for (int q = 0; q < n; ++q) jobs.push_back(job(p.full[size_t(q)], q));
  const std::vector<Outcome> got = run_jobs(e, jobs);
  for (int q = 0; q < n; ++q) {
    EXPECT_EQ(got[size_t(q)].cached, q == 0 ? 0 : 70) << "request " << q;
    EXPECT_TRUE(got[size_t(q)] == alone(*ref_be, V, jobs[size_t(q)])) << "request " << q;
  }
  // A prompt that shares less than kMinShared tokens with the one in flight does not wait for it.
  std::vector<int32_t> other(p.system.begin(), p.system.begin() + 20);
  for (int i = 0; i < 60; ++i) other.push_back(int32_t((i * 37 + 11) % V));
  const std::vector<Outcome> two = run_jobs(e, {job(p.full[0], 0), job(other, 1)});
  EXPECT_EQ(two[1].cached, 0);
  EXPECT_TRUE(two[1] == alone(*ref_be, V, job(other, 1)));
}

inline void off_reuses_nothing(Device d) {
  auto m = model_load(default_model());
  const int64_t V = m->config.vocab_size;
  const Prompts p(V, 3);
  auto be = make_backend(*m, d);
  Engine e(*be, nullptr, V, opts(false), nullptr);
  for (int q = 0; q < 3; ++q) EXPECT_EQ(run_jobs(e, {job(p.full[size_t(q)], q)})[0].cached, 0);
  // The same prompt again: with caching off, still nothing.
  EXPECT_EQ(run_jobs(e, {job(p.full[0], 0)})[0].cached, 0);
}

}  // namespace prefix_cache_suite
