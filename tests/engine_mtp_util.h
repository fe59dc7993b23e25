// The engine MTP tests' jobs and runner (tests/test_engine_mtp.cpp, tests/gpu/test_mtp_cuda.cpp): a mix
// of greedy, sampled, penalised, stopping, context-bound, chunk-prefilled and prompt-logprobs jobs, run to
// the end with every token, logprob and finish reason kept for comparison.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "runtime/engine.h"

namespace cm::test::engine_mtp {

using namespace cm::runtime;

struct Outcome {
  std::vector<int32_t> ids;
  std::vector<float> lp;
  std::vector<std::vector<TopLogprob>> top;
  std::string reason;
  int64_t cached = 0;  // the Finish event's cached_tokens (not compared by ==)
  bool operator==(const Outcome& o) const {
    if (ids != o.ids || reason != o.reason || lp.size() != o.lp.size() || top.size() != o.top.size()) return false;
    if (std::memcmp(lp.data(), o.lp.data(), lp.size() * 4) != 0) return false;
    for (size_t i = 0; i < top.size(); ++i) {
      if (top[i].size() != o.top[i].size()) return false;
      for (size_t j = 0; j < top[i].size(); ++j)
        if (top[i][j].id != o.top[i][j].id || std::memcmp(&top[i][j].logprob, &o.top[i][j].logprob, 4) != 0) return false;
    }
    return true;
  }
};

// Submits every job at once (admitted as slots free up) and steps until all have finished.
inline std::vector<Outcome> run_jobs(Engine& e, const std::vector<JobSpec>& specs) {
  std::vector<std::shared_ptr<Job>> jobs;
  for (const JobSpec& s : specs) jobs.push_back(std::make_shared<Job>(s));
  e.submit(jobs);
  std::vector<Outcome> out(specs.size());
  std::vector<bool> done(specs.size(), false);
  for (int guard = 0; guard < 100000; ++guard) {
    const bool worked = e.step_once();
    for (size_t i = 0; i < jobs.size(); ++i)
      for (JobEvent& ev : jobs[i]->pop(0)) {
        for (const TokenOut& t : ev.tokens) {
          out[i].ids.push_back(t.id);
          out[i].lp.push_back(t.logprob);
          out[i].top.push_back(t.top);
        }
        if (ev.kind == JobEvent::Finish) {
          out[i].reason = ev.finish_reason + (ev.error.empty() ? "" : ": " + ev.error);
          out[i].cached = ev.cached_tokens;
          done[i] = true;
        }
      }
    if (std::all_of(done.begin(), done.end(), [](bool d) { return d; })) return out;
    if (!worked) break;
  }
  ADD_FAILURE() << "jobs did not finish";
  return out;
}

inline std::vector<JobSpec> mixed_jobs(int64_t V, int64_t ctx) {
  std::mt19937 rng(5);
  auto prompt = [&](size_t n) {
    std::vector<int32_t> p(n);
    for (int32_t& t : p) t = int32_t(rng() % uint32_t(V));
    return p;
  };
  std::vector<JobSpec> v;
  JobSpec greedy;
  greedy.prompt = prompt(9);
  greedy.max_tokens = 40;
  greedy.ignore_eos = true;
  v.push_back(greedy);
  JobSpec hot;
  hot.prompt = prompt(30);
  hot.max_tokens = 33;
  hot.ignore_eos = true;
  hot.sampling.temperature = 0.8f, hot.sampling.seed = 3, hot.sampling.top_k = 40, hot.sampling.top_p = 0.9f;
  v.push_back(hot);
  JobSpec pen;
  pen.prompt = prompt(5);
  pen.max_tokens = 25;
  pen.ignore_eos = true;
  pen.sampling.temperature = 0.6f, pen.sampling.seed = 9, pen.sampling.repetition_penalty = 1.3f;
  pen.sampling.presence_penalty = 0.4f, pen.sampling.frequency_penalty = 0.2f;
  pen.logprobs = 3;
  v.push_back(pen);
  JobSpec stops = greedy;
  stops.prompt = prompt(17);
  stops.max_tokens = 30;
  stops.ignore_eos = false;
  stops.min_tokens = 4;
  for (int32_t t = 0; t < 12; ++t) stops.stop_token_ids.push_back(int32_t(rng() % uint32_t(V)));
  v.push_back(stops);
  JobSpec edge = hot;  // runs into the context
  edge.prompt = prompt(size_t(ctx - 11));
  edge.max_tokens = 100;
  edge.sampling.seed = 21;
  v.push_back(edge);
  JobSpec greedy2 = greedy;
  greedy2.prompt = prompt(60);  // a long prompt prefilled in chunks beside the others' verify runs
  greedy2.max_tokens = 19;
  v.push_back(greedy2);
  JobSpec echo = greedy;  // every prompt row's logits, in steps beside the others' verify rows
  echo.prompt = prompt(40);
  echo.max_tokens = 12;
  echo.prompt_logprobs = true;
  echo.logprobs = 2;
  v.push_back(echo);
  return v;
}

inline EngineOptions options(int32_t mtp, int64_t ctx) {
  EngineOptions o;
  o.max_seqs = 3;
  o.max_step_tokens = 24;
  o.ctx = ctx;
  o.mtp_draft = mtp;
  o.sample_on_device = false;
  return o;
}

}  // namespace cm::test::engine_mtp
