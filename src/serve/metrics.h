// Server metrics in the Prometheus text format, under vLLM's metric names with the `clawmine:`
// prefix (so vLLM dashboards work after a rename): requests running/waiting, prompt and
// generation token counters, TTFT / inter-token / end-to-end latency histograms, finished
// requests by reason, and prefix-reuse queries and hits (in tokens). Thread-safe: the engine
// thread records, HTTP threads render.
#pragma once
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/engine_metrics.h"

namespace cm::serve {

struct Histogram {
  std::vector<double> bounds;    // upper bounds, ascending (+Inf implied)
  std::vector<uint64_t> counts;  // per bucket, not cumulative; size bounds + 1
  double sum = 0;
  uint64_t count = 0;
  explicit Histogram(std::vector<double> b) : bounds(std::move(b)), counts(bounds.size() + 1, 0) {}
  void observe(double v);
};

class Metrics : public runtime::EngineMetrics {
 public:
  explicit Metrics(std::string model_name);
  void set_queue(int64_t running, int64_t waiting) override;
  void add_prompt_tokens(int64_t n) override;
  void add_generation_tokens(int64_t n) override;
  void observe_ttft(double s) override;
  void observe_inter_token(double s) override;
  void observe_e2e(double s) override;
  void request_finished(const std::string& reason) override;
  void prefix_cache(int64_t queried_tokens, int64_t hit_tokens) override;
  void spec_decode(int64_t drafted, int64_t accepted) override;
  void engine_step(int64_t tokens, double backend_s, double sample_s, double engine_s) override;
  std::string render() const;

 private:
  mutable std::mutex mu_;
  std::string model_;
  int64_t running_ = 0, waiting_ = 0;
  int64_t prompt_tokens_ = 0, generation_tokens_ = 0, prefix_queries_ = 0, prefix_hits_ = 0, prefix_hit_requests_ = 0;
  // MTP (vLLM's spec_decode counters): verify rounds, draft tokens, accepted drafts, by position.
  int64_t spec_rounds_ = 0, spec_drafted_ = 0, spec_accepted_ = 0;
  std::vector<int64_t> spec_accepted_at_;
  // Engine steps: count, batch rows, and where their time went (seconds).
  int64_t steps_ = 0, step_tokens_ = 0;
  double step_backend_s_ = 0, step_sample_s_ = 0, step_engine_s_ = 0;
  Histogram ttft_, itl_, e2e_;
  std::map<std::string, int64_t> finished_;
};

}  // namespace cm::serve
