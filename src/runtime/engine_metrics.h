// What the engine reports while it runs, as an interface: the server's Prometheus metrics
// (serve::Metrics) implement it, so the engine needs nothing from the serving layer above it.
// Called on the engine thread only.
#pragma once
#include <cstdint>
#include <string>

namespace cm::runtime {

class EngineMetrics {
 public:
  virtual ~EngineMetrics() = default;
  virtual void set_queue(int64_t running, int64_t waiting) = 0;
  virtual void add_prompt_tokens(int64_t n) = 0;
  virtual void add_generation_tokens(int64_t n) = 0;
  virtual void observe_ttft(double s) = 0;
  virtual void observe_inter_token(double s) = 0;
  virtual void observe_e2e(double s) = 0;
  virtual void request_finished(const std::string& reason) = 0;
  virtual void prefix_cache(int64_t queried_tokens, int64_t hit_tokens) = 0;
  // MTP: one verify round of `drafted` drafts of which the first `accepted` were accepted.
  virtual void spec_decode(int64_t drafted, int64_t accepted) = 0;
  // One engine step of `tokens` batch rows, in seconds: the backend's calls (MTP drafts and the step),
  // the sampling (the device's draw or the host's over downloaded logits, with the stop rules and each
  // token handed to its request), and the engine's own around them (admission, the batch). A GPU step
  // that samples on the device returns once its kernels are queued: its wait lands in the sampling.
  virtual void engine_step(int64_t tokens, double backend_s, double sample_s, double engine_s) = 0;
};

}  // namespace cm::runtime
