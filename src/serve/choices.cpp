// A request's choices (see choices.h).
#include "serve/choices.h"

#include <algorithm>
#include <numeric>

namespace cm::serve {

using Json = nlohmann::ordered_json;

uint64_t choice_seed(uint64_t seed, int64_t i) {
  if (i == 0) return seed;
  uint64_t z = seed + uint64_t(i) * 0x9E3779B97F4A7C15ull;  // splitmix64
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

std::vector<std::shared_ptr<Job>> make_jobs(const ApiRequest& r, const JobSpec& base,
                                            const std::vector<std::vector<int32_t>>& prompts,
                                            const std::vector<int64_t>& max_tokens,
                                            const std::function<uint64_t()>& random_seed) {
  std::vector<std::shared_ptr<Job>> jobs;
  const int64_t per = r.best_of;
  const bool many = int64_t(prompts.size()) * per > 1;
  // echo + logprobs: every candidate computes its prompt's logprobs itself (prompt rows cannot be
  // copied), so such candidates do not fork.
  const bool prompt_lp = r.echo && r.logprobs >= 0;
  for (size_t p = 0; p < prompts.size(); ++p) {
    for (int64_t c = 0; c < per; ++c) {
      const int64_t i = int64_t(p) * per + c;
      JobSpec s = base;
      if (many) s.id = base.id + "-" + std::to_string(i);
      s.prompt = prompts[p];
      s.max_tokens = max_tokens[p];
      s.sampling.seed = r.seed_given ? choice_seed(r.sampling.seed, i) : random_seed();
      if (r.best_of > r.n) s.logprobs = std::max(s.logprobs, 0);  // ranking needs the logprobs
      s.prompt_logprobs = prompt_lp;
      if (!prompt_lp && per > 1) {
        if (c == 0) s.forks = int(per - 1);
        else s.fork_of = jobs[p * size_t(per)];
      }
      jobs.push_back(std::make_shared<Job>(std::move(s)));
    }
  }
  return jobs;
}

ChoiceSet::ChoiceSet(const ApiRequest& req, ResponseMeta meta, const Tokenizer& tok,
                     std::vector<std::shared_ptr<Job>> jobs, const std::vector<std::string>& echo_texts)
    : req_(req), meta_(std::move(meta)), jobs_(std::move(jobs)), ended_(jobs_.size(), 0) {
  for (size_t i = 0; i < jobs_.size(); ++i) {
    resp_.push_back(std::make_unique<Responder>(req_, meta_, tok));
    if (jobs_.size() > 1) resp_.back()->set_choice(int(i));
    if (req_.echo && req_.endpoint == Endpoint::Completions) resp_.back()->set_echo(echo_texts[i / size_t(req_.best_of)]);
  }
}

void ChoiceSet::cancel() {
  for (auto& j : jobs_) j->cancelled = true;
}

std::vector<JobEvent> ChoiceSet::pop(size_t i, int timeout_ms) {
  std::vector<JobEvent> got = jobs_[i]->pop(timeout_ms);
  if (!got_token_)
    for (const JobEvent& e : got)
      if (e.kind == JobEvent::Token) {
        got_token_ = true;
        first_token_ = std::chrono::steady_clock::now();
        break;
      }
  return got;
}

void ChoiceSet::after_event(size_t i, const JobEvent& e) {
  if (e.kind != JobEvent::Finish) return;
  ended_[i] = 1;
  if (resp_[i]->failed()) {
    // One failed choice fails the request; the others stop.
    error_ = resp_[i]->error();
    cancel();
    done_ = true;
  } else if (std::all_of(ended_.begin(), ended_.end(), [](uint8_t x) { return x != 0; })) {
    done_ = true;
  }
}

void ChoiceSet::consume(int timeout_ms) {
  // Every job's available events; when none had any, wait on the first unfinished one (briefly when
  // there are several, so the others' events are not held up).
  bool any = false;
  for (size_t i = 0; i < jobs_.size() && !done_; ++i) {
    if (ended_[i]) continue;
    for (const JobEvent& e : pop(i, 0)) {
      any = true;
      resp_[i]->consume(e);
      after_event(i, e);
    }
  }
  if (any || done_) return;
  const int wait = jobs_.size() == 1 ? timeout_ms : std::min(timeout_ms, 20);
  for (size_t i = 0; i < jobs_.size(); ++i) {
    if (ended_[i]) continue;
    for (const JobEvent& e : pop(i, wait)) {
      resp_[i]->consume(e);
      after_event(i, e);
    }
    break;
  }
}

std::string ChoiceSet::stream_start() {
  std::string out;
  for (auto& r : resp_) out += r->stream_start();
  return out;
}

std::string ChoiceSet::stream(int timeout_ms) {
  std::string out;
  const bool was_done = done_;
  auto take = [&](size_t i, int wait) {
    bool any = false;
    for (const JobEvent& e : pop(i, wait)) {
      any = true;
      out += resp_[i]->stream(e);
      after_event(i, e);
      if (done_) break;
    }
    return any;
  };
  bool any = false;
  for (size_t i = 0; i < jobs_.size() && !done_; ++i)
    if (!ended_[i]) any |= take(i, 0);
  if (!any && !done_) {
    const int wait = jobs_.size() == 1 ? timeout_ms : std::min(timeout_ms, 20);
    for (size_t i = 0; i < jobs_.size(); ++i)
      if (!ended_[i]) {
        take(i, wait);
        break;
      }
  }
  // A lone Responder ended the stream itself; several choices end together here.
  if (done_ && !was_done && jobs_.size() > 1) {
    if (req_.include_usage && error_.empty()) {
      Json u = {{"id", meta_.id},
                {"object", req_.endpoint == Endpoint::Chat ? "chat.completion.chunk" : "text_completion"},
                {"created", meta_.created},
                {"model", meta_.model},
                {"choices", Json::array()},
                {"usage", usage()}};
      out += sse(u);
    }
    out += "data: [DONE]\n\n";
  }
  return out;
}

Json ChoiceSet::usage() const {
  int64_t cached = 0;
  for (size_t i = 0; i < resp_.size(); i += size_t(req_.best_of)) cached += resp_[i]->cached_tokens();
  const int64_t p = prompt_tokens(), c = completion_tokens();
  return {{"prompt_tokens", p},
          {"completion_tokens", c},
          {"total_tokens", p + c},
          {"prompt_tokens_details", {{"cached_tokens", cached}}}};
}

int64_t ChoiceSet::prompt_tokens() const {
  int64_t n = 0;
  for (size_t i = 0; i < resp_.size(); i += size_t(req_.best_of)) n += resp_[i]->prompt_tokens();
  return n;
}

int64_t ChoiceSet::completion_tokens() const {
  int64_t n = 0;
  for (const auto& r : resp_) n += r->completion_tokens();
  return n;
}

std::string ChoiceSet::finish_reason() const { return resp_.empty() ? "" : resp_[0]->finish_reason(); }

double ChoiceSet::ttft(std::chrono::steady_clock::time_point arrived) const {
  return got_token_ ? std::chrono::duration<double>(first_token_ - arrived).count() : -1;
}

std::string ChoiceSet::body() const {
  if (resp_.size() == 1) return resp_[0]->body();
  const size_t per = size_t(req_.best_of), n = size_t(req_.n);
  Json choices = Json::array();
  for (size_t p = 0; p * per < resp_.size(); ++p) {
    std::vector<size_t> order(per);
    std::iota(order.begin(), order.end(), p * per);
    // best_of: the n candidates of highest cumulative logprob, best first (ties: lower index).
    if (per > n)
      std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
        return resp_[a]->cumulative_logprob() > resp_[b]->cumulative_logprob();
      });
    for (size_t k = 0; k < n; ++k) {
      Json c = resp_[order[k]]->choice_json();
      c["index"] = p * n + k;
      choices.push_back(std::move(c));
    }
  }
  const bool chat = req_.endpoint == Endpoint::Chat;
  Json r = {{"id", meta_.id},
            {"object", chat ? "chat.completion" : "text_completion"},
            {"created", meta_.created},
            {"model", meta_.model},
            {"choices", std::move(choices)},
            {"usage", usage()}};
  return r.dump(-1, ' ', false, Json::error_handler_t::replace);
}

}  // namespace cm::serve
