// The engine's running sequence (engine.cpp's scheduler and engine_mtp.cpp's speculation share it).
#pragma once
#include <algorithm>
#include <chrono>
#include <memory>
#include <vector>

#include "runtime/engine.h"
#include "runtime/row_sampler.h"
#include "runtime/stop_rule.h"

namespace cm::runtime {

// A running sequence: its job, its slot, and the per-request sampling and text state.
struct Engine::Seq {
  std::shared_ptr<Job> job;
  int32_t slot = -1;
  int64_t fed = 0;                 // prompt tokens in the slot's state
  int64_t reused = 0;              // of which came from prefix reuse
  std::vector<int32_t> hist;       // prompt + generated (the penalties' history)
  int64_t generated = 0;
  int32_t pending = -1;            // sampled token still to be fed (decode phase)
  std::vector<int32_t> drafts;     // MTP: this step's drafts after `pending` (empty: a plain decode)
  bool hold_last = false;          // forks wait for this prompt's state: stop one token short once
  int64_t snap_at = 0;             // prefix caching: the prefill pauses here for a snapshot (0: none)
  // In-flight sharing: an earlier admitted prompt (wait_job) is computing this prompt's first
  // wait_until tokens; this one waits (feeds nothing) while wait_job is set, then copies that state
  // (Engine::waits_for_shared, which clears it once).
  std::shared_ptr<Job> wait_job;
  int64_t wait_until = 0;
  std::vector<TokenOut> prompt_lp; // prompt_logprobs: prompt tokens 1.. so far
  RowSampler sampler;
  StopRule rule;
  std::unique_ptr<TokenConstraint> constraint;  // structured output (null: none)
  std::chrono::steady_clock::time_point arrival, first_token, last_token;
  Seq(std::shared_ptr<Job> j, const Tokenizer* tok, const EngineOptions& opt)
      : job(std::move(j)), sampler(job->spec.sampling, job->spec.prompt), rule(stop_params(job->spec, opt), tok,
                                                              int64_t(job->spec.prompt.size())) {}
  static StopParams stop_params(const JobSpec& spec, const EngineOptions& opt) {
    StopParams p;
    p.eos_ids = opt.eos_ids;
    p.max_tokens = spec.max_tokens;
    p.ctx = opt.ctx;
    p.stop = spec.stop;
    p.stop_token_ids = spec.stop_token_ids;
    p.ignore_eos = spec.ignore_eos;
    p.min_tokens = spec.min_tokens;
    return p;
  }
  bool prefilling() const { return fed < int64_t(job->spec.prompt.size()); }
  // Where this step's prefill chunk may end: one token short of the prompt while holding for forks.
  int64_t prefill_end() {
    const int64_t len = int64_t(job->spec.prompt.size());
    if (hold_last && fed == len - 1) hold_last = false;  // the forks had their admission; go on
    const int64_t end = hold_last ? len - 1 : len;
    return snap_at > fed ? std::min(end, snap_at) : end;
  }
};

}  // namespace cm::runtime
