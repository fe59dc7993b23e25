// Prometheus text exposition (version 0.0.4) of the server's counters; see metrics.h.
#include "serve/metrics.h"

#include <fmt/format.h>

namespace cm::serve {

void Histogram::observe(double v) {
  size_t i = 0;
  while (i < bounds.size() && v > bounds[i]) ++i;
  ++counts[i];
  sum += v;
  ++count;
}

namespace {
// vLLM's bucket edges for these histograms.
std::vector<double> ttft_buckets() {
  return {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0};
}
std::vector<double> itl_buckets() {
  return {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0};
}
std::vector<double> e2e_buckets() {
  return {0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0};
}

std::string label_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '\\' || c == '"') o += '\\';
    if (c == '\n') { o += "\\n"; continue; }
    o += c;
  }
  return o;
}

void histogram_text(std::string& out, const char* name, const char* help, const Histogram& h, const std::string& lbl) {
  out += fmt::format("# HELP clawmine:{} {}\n# TYPE clawmine:{} histogram\n", name, help, name);
  uint64_t cum = 0;
  for (size_t i = 0; i <= h.bounds.size(); ++i) {
    cum += h.counts[i];
    std::string le = i < h.bounds.size() ? fmt::format("{}", h.bounds[i]) : "+Inf";
    out += fmt::format("clawmine:{}_bucket{{{},le=\"{}\"}} {}\n", name, lbl, le, cum);
  }
  out += fmt::format("clawmine:{}_sum{{{}}} {}\nclawmine:{}_count{{{}}} {}\n", name, lbl, h.sum, name, lbl, h.count);
}

void scalar(std::string& out, const char* name, const char* type, const char* help, const std::string& lbl, int64_t v) {
  out += fmt::format("# HELP clawmine:{} {}\n# TYPE clawmine:{} {}\nclawmine:{}{{{}}} {}\n", name, help, name, type, name,
                     lbl, v);
}
}  // namespace

Metrics::Metrics(std::string model_name)
    : model_(std::move(model_name)), ttft_(ttft_buckets()), itl_(itl_buckets()), e2e_(e2e_buckets()) {}

void Metrics::set_queue(int64_t running, int64_t waiting) {
  std::lock_guard<std::mutex> l(mu_);
  running_ = running;
  waiting_ = waiting;
}
void Metrics::add_prompt_tokens(int64_t n) {
  std::lock_guard<std::mutex> l(mu_);
  prompt_tokens_ += n;
}
void Metrics::add_generation_tokens(int64_t n) {
  std::lock_guard<std::mutex> l(mu_);
  generation_tokens_ += n;
}
void Metrics::observe_ttft(double s) {
  std::lock_guard<std::mutex> l(mu_);
  ttft_.observe(s);
}
void Metrics::observe_inter_token(double s) {
  std::lock_guard<std::mutex> l(mu_);
  itl_.observe(s);
}
void Metrics::observe_e2e(double s) {
  std::lock_guard<std::mutex> l(mu_);
  e2e_.observe(s);
}
void Metrics::request_finished(const std::string& reason) {
  std::lock_guard<std::mutex> l(mu_);
  ++finished_[reason];
}
void Metrics::prefix_cache(int64_t queried, int64_t hit) {
  std::lock_guard<std::mutex> l(mu_);
  prefix_queries_ += queried;
  prefix_hits_ += hit;
  if (hit > 0) ++prefix_hit_requests_;
}

void Metrics::spec_decode(int64_t drafted, int64_t accepted) {
  std::lock_guard<std::mutex> l(mu_);
  ++spec_rounds_;
  spec_drafted_ += drafted;
  spec_accepted_ += accepted;
  if (spec_accepted_at_.size() < size_t(drafted)) spec_accepted_at_.resize(size_t(drafted), 0);
  for (int64_t j = 0; j < accepted; ++j) ++spec_accepted_at_[size_t(j)];
}

void Metrics::engine_step(int64_t tokens, double backend_s, double sample_s, double engine_s) {
  std::lock_guard<std::mutex> l(mu_);
  ++steps_;
  step_tokens_ += tokens;
  step_backend_s_ += backend_s;
  step_sample_s_ += sample_s;
  step_engine_s_ += engine_s;
}

std::string Metrics::render() const {
  std::lock_guard<std::mutex> l(mu_);
  const std::string lbl = fmt::format("model_name=\"{}\"", label_escape(model_));
  std::string o;
  scalar(o, "num_requests_running", "gauge", "Requests in the running batch.", lbl, running_);
  scalar(o, "num_requests_waiting", "gauge", "Requests waiting for a slot.", lbl, waiting_);
  scalar(o, "prompt_tokens_total", "counter", "Prompt tokens processed (prefilled or reused).", lbl, prompt_tokens_);
  scalar(o, "generation_tokens_total", "counter", "Generated tokens.", lbl, generation_tokens_);
  scalar(o, "prefix_cache_queries_total", "counter", "Prompt tokens looked up for prefix reuse.", lbl, prefix_queries_);
  scalar(o, "prefix_cache_hits_total", "counter", "Prompt tokens reused from a slot's state.", lbl, prefix_hits_);
  scalar(o, "prefix_cache_hit_requests_total", "counter", "Requests that reused a slot's state.", lbl,
         prefix_hit_requests_);
  o += "# HELP clawmine:request_success_total Finished requests by finish reason.\n"
       "# TYPE clawmine:request_success_total counter\n";
  for (const char* r : {"stop", "length", "cancelled", "error"}) {
    auto it = finished_.find(r);
    o += fmt::format("clawmine:request_success_total{{{},finished_reason=\"{}\"}} {}\n", lbl, r,
                     it == finished_.end() ? 0 : it->second);
  }
  scalar(o, "spec_decode_num_drafts_total", "counter", "MTP verify rounds (a sequence's token and its drafts in one step).",
         lbl, spec_rounds_);
  scalar(o, "spec_decode_num_draft_tokens_total", "counter", "MTP draft tokens proposed.", lbl, spec_drafted_);
  scalar(o, "spec_decode_num_accepted_tokens_total", "counter", "MTP draft tokens accepted.", lbl, spec_accepted_);
  o += "# HELP clawmine:spec_decode_num_accepted_tokens_per_pos_total MTP drafts accepted by their position in the round.\n"
       "# TYPE clawmine:spec_decode_num_accepted_tokens_per_pos_total counter\n";
  for (size_t j = 0; j < spec_accepted_at_.size(); ++j)
    o += fmt::format("clawmine:spec_decode_num_accepted_tokens_per_pos_total{{{},position=\"{}\"}} {}\n", lbl, j,
                     spec_accepted_at_[j]);
  scalar(o, "engine_steps_total", "counter", "Engine steps run.", lbl, steps_);
  scalar(o, "engine_step_tokens_total", "counter", "Batch rows of the engine's steps (prefill and decode tokens).", lbl,
         step_tokens_);
  o += "# HELP clawmine:engine_step_seconds_total Engine step time by part: backend (MTP drafts and the step; on "
       "the GPU with device sampling only the kernels' launch), sample (the wait for them, drawing the tokens, handing "
       "them out), engine (admission, the batch).\n# TYPE clawmine:engine_step_seconds_total counter\n";
  o += fmt::format("clawmine:engine_step_seconds_total{{{},part=\"backend\"}} {}\n", lbl, step_backend_s_);
  o += fmt::format("clawmine:engine_step_seconds_total{{{},part=\"sample\"}} {}\n", lbl, step_sample_s_);
  o += fmt::format("clawmine:engine_step_seconds_total{{{},part=\"engine\"}} {}\n", lbl, step_engine_s_);
  histogram_text(o, "time_to_first_token_seconds", "Time from arrival to the first generated token.", ttft_, lbl);
  histogram_text(o, "inter_token_latency_seconds", "Time between consecutive generated tokens.", itl_, lbl);
  histogram_text(o, "e2e_request_latency_seconds", "Time from arrival to the last token.", e2e_, lbl);
  return o;
}

}  // namespace cm::serve
