// One request's choices: its jobs (prompt-major: best_of candidates for each prompt of a
// completions list, one prompt for chat) and the response they make together. make_jobs builds
// the JobSpecs (each candidate's seed, the first candidate of a prompt forked by the others so the
// prompt is prefilled once); ChoiceSet relays every job's events through one Responder per job
// and merges them: non-streaming, `choices` holds for each prompt its n candidates of highest
// cumulative logprob (all of them when best_of = n) indexed prompt × n + k; streaming, each
// choice's chunks carry its index, and the usage chunk and [DONE] come once every choice ended.
// Usage counts each prompt once and sums every candidate's completion tokens.
// A single job is relayed exactly as a lone Responder does.
#pragma once
#include <chrono>
#include <functional>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "serve/openai.h"

namespace cm::serve {

// Candidate i's sampling seed (i counts every job of the request, prompt-major): the request's
// seed itself for i = 0 (so n = 1 answers as before), else splitmix64(seed + i·0x9E3779B97F4A7C15):
// reproducible for a given seed, and different per choice.
uint64_t choice_seed(uint64_t seed, int64_t i);

// The jobs of a request: `base` (the request's JobSpec, prompt unset) for every prompt and
// candidate. Without a seed in the request each job gets `random_seed()`.
std::vector<std::shared_ptr<Job>> make_jobs(const ApiRequest& r, const JobSpec& base,
                                            const std::vector<std::vector<int32_t>>& prompts,
                                            const std::vector<int64_t>& max_tokens,
                                            const std::function<uint64_t()>& random_seed);

class ChoiceSet {
 public:
  // echo_texts: each prompt's text (echo only; empty otherwise).
  ChoiceSet(const ApiRequest& req, ResponseMeta meta, const Tokenizer& tok, std::vector<std::shared_ptr<Job>> jobs,
            const std::vector<std::string>& echo_texts);
  // Non-streaming: takes the events available, waiting up to timeout_ms for some.
  void consume(int timeout_ms);
  std::string body() const;
  // Streaming: the opening chunk(s), then the SSE text of the events available (after the last
  // choice's end: the usage chunk and "data: [DONE]").
  std::string stream_start();
  std::string stream(int timeout_ms);

  bool done() const { return done_; }
  bool failed() const { return !error_.empty(); }
  const std::string& error() const { return error_; }
  void cancel();  // every job (the client left)
  const std::string& id() const { return meta_.id; }
  int64_t prompt_tokens() const;
  int64_t completion_tokens() const;
  std::string finish_reason() const;
  // Seconds from `arrived` to the first token event of any choice (-1: none yet).
  double ttft(std::chrono::steady_clock::time_point arrived) const;

 private:
  std::vector<JobEvent> pop(size_t i, int timeout_ms);
  void after_event(size_t i, const JobEvent& e);
  nlohmann::ordered_json usage() const;

  const ApiRequest& req_;
  ResponseMeta meta_;
  std::vector<std::shared_ptr<Job>> jobs_;
  std::vector<std::unique_ptr<Responder>> resp_;
  std::vector<uint8_t> ended_;
  bool done_ = false;
  std::string error_;
  std::chrono::steady_clock::time_point first_token_{};
  bool got_token_ = false;
};

}  // namespace cm::serve
