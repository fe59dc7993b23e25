// Event-based op timing of a backend step (see op_timer.h).
#include "backend/cuda/core/op_timer.h"

#include "backend/cuda/core/cuda_errors.h"
#include "backend/cuda/core/cuda_util.h"

namespace cm::cuda {

OpTimer::OpTimer(size_t max_marks) : ev_(max_marks + 2, nullptr), labels_(max_marks + 2, nullptr) {
  for (cudaEvent_t& e : ev_) CM_CUDA(cudaEventCreate(&e));
}

OpTimer::~OpTimer() {
  for (cudaEvent_t e : ev_)
    if (e) cudaEventDestroy(e);
}

void OpTimer::record(const char* label, cudaStream_t s) {
  if (n_ >= ev_.size()) {
    overflow_ = true;
    return;
  }
  labels_[n_] = label;
  CM_CUDA(cudaEventRecord(ev_[n_], s));
  ++n_;
}

void OpTimer::begin(cudaStream_t s) {
  n_ = 0;
  overflow_ = false;
  if (mode_ != Mode::OFF) record("begin", s);
}

void OpTimer::mark(const char* label, cudaStream_t s) {
  if (mode_ == Mode::OPS) record(label, s);
}

void OpTimer::end(cudaStream_t s) {
  if (mode_ == Mode::OFF) return;
  if (n_ >= ev_.size()) n_ = ev_.size() - 1, overflow_ = true;  // the last event is always the end
  record("end", s);
}

double OpTimer::span_ms() const {
  CM_CU_CHECK(n_ >= 2, "op timer: no step was timed (mode off, or the step did not run)");
  float ms = 0;
  CM_CUDA(cudaEventElapsedTime(&ms, ev_[0], ev_[n_ - 1]));
  return ms;
}

std::vector<OpTimer::OpTime> OpTimer::totals() const {
  CM_CU_CHECK(!overflow_, "op timer: the step launched more than %zu ops; make the timer larger", ev_.size() - 2);
  std::vector<OpTime> out;
  for (size_t i = 1; i < n_; ++i) {
    float ms = 0;
    CM_CUDA(cudaEventElapsedTime(&ms, ev_[i - 1], ev_[i]));
    const std::string label = labels_[i];
    size_t j = 0;
    while (j < out.size() && out[j].label != label) ++j;
    if (j == out.size()) out.push_back(OpTime{label, 0, 0});
    out[j].ms += ms;
    out[j].calls++;
  }
  return out;
}

OpScope::~OpScope() noexcept(false) {
  if (std::uncaught_exceptions() > exceptions_) return;
  if (OpTimer* t = ctx_.timer()) t->mark(label_, ctx_.stream());
}

}  // namespace cm::cuda
