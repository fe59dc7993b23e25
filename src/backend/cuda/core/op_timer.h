// Times a CUDA backend step op by op without a profiler (no nsys, no CUPTI):
// the backend records a CUDA event on its stream at the end of each op (an
// OpScope: a linear, a norm, the attention kernel, the MoE kernels, ...) with a label, and the
// time between one event and the next is that op's. Events are timestamps
// taken as the stream reaches them, so the intervals are GPU time, and the
// sum of all of them is the step's GPU span. Recording an event costs a few
// microseconds of host time per op; a profiled step is for attribution, not
// for the step's own time. In SPAN mode only the step's first and last events
// are recorded (the step's GPU time at no per-op cost).
#pragma once
#include <cuda_runtime.h>

#include <exception>
#include <string>
#include <utility>
#include <vector>

namespace cm::cuda {

class Context;

class OpTimer {
 public:
  enum class Mode { OFF, SPAN, OPS };
  explicit OpTimer(size_t max_marks);
  ~OpTimer();
  OpTimer(const OpTimer&) = delete;
  OpTimer& operator=(const OpTimer&) = delete;

  void set_mode(Mode m) { mode_ = m; }
  Mode mode() const { return mode_; }
  // The step's first event (called by the backend at the start of a step).
  void begin(cudaStream_t s);
  // An op just launched: the interval since the previous event is `label`'s.
  // Labels are kept as pointers and must outlive the timer (literals, weight names).
  void mark(const char* label, cudaStream_t s);
  // The step's last event (called by the backend at the end of a step, before its sync).
  void end(cudaStream_t s);

  // After the stream has synchronised: the GPU milliseconds from begin to end.
  double span_ms() const;
  // Per label (OPS mode): total milliseconds and number of calls, in first-seen order.
  struct OpTime {
    std::string label;
    double ms = 0;
    int calls = 0;
  };
  std::vector<OpTime> totals() const;

 private:
  void record(const char* label, cudaStream_t s);
  Mode mode_ = Mode::OFF;
  std::vector<cudaEvent_t> ev_;
  std::vector<const char*> labels_;
  size_t n_ = 0;
  bool overflow_ = false;
};

// One named op of a step: the kernels launched on ctx's stream during the scope's life are grouped under
// `label` in the timer attached to the Context (Context::set_timer); at the scope's end the interval since
// the previous event is the op's. Nothing without a timer or outside OPS mode. Scopes may nest (the inner
// op ends first; the outer one gets what follows it). The label must outlive the timer (a literal, a weight
// name).
//   { cuda::OpScope op(ctx, "attn.wq_a+wkv"); run_linear_pair(...); }
class OpScope {
 public:
  OpScope(Context& ctx, const char* label) : ctx_(ctx), label_(label), exceptions_(std::uncaught_exceptions()) {}
  ~OpScope() noexcept(false);
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;

 private:
  Context& ctx_;
  const char* label_;
  int exceptions_;  // records nothing when it ends by an exception (the step failed)
};

}  // namespace cm::cuda
