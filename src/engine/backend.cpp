// The parts of the seam every backend shares: batch validation and the factory.
#include "engine/backend.h"

#include <unistd.h>

#include "common/error.h"
#include "model/model.h"
#if CLAWMINE_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace cm {

std::unique_ptr<ModelBackend> make_cpu_backend(const Model& m, const BackendOptions& opt);

bool gpu_present() {
#ifdef CLAWMINE_HAVE_CUDA
  return ::access("/dev/nvidiactl", F_OK) == 0 || ::access("/dev/nvidia0", F_OK) == 0;
#else
  return false;
#endif
}

const char* device_name(Device d) { return d == Device::CPU ? "cpu" : "cuda"; }

void check_batch(const Batch& b, const CacheShape& shape, int64_t vocab, const int64_t* slot_pos) {
  if (shape.max_slots < 1) fail("step: the backend has not been reserved (call reserve first)");
  if (b.n < 1) fail("step: empty batch");
  if (b.n > shape.max_step_tokens)
    fail("step: {} tokens exceed the reserved max_step_tokens of {}", b.n, shape.max_step_tokens);
  if (!b.token || !b.pos || !b.slot || !b.logits) fail("step: batch arrays missing");
  int32_t prev_slot = -1;
  int64_t expect = 0;
  for (int32_t i = 0; i < b.n; ++i) {
    const int32_t s = b.slot[i];
    if (s < 0 || s >= shape.max_slots) fail("step: row {}: slot {} outside the reserved [0, {})", i, s, shape.max_slots);
    if (b.token[i] < 0 || b.token[i] >= vocab)
      fail("step: row {}: token id {} is outside the vocabulary [0, {})", i, b.token[i], vocab);
    if (s != prev_slot) {
      for (int32_t j = 0; j < i; ++j)
        if (b.slot[j] == s) fail("step: slot {}'s tokens are not contiguous in the batch (rows {} and {})", s, j, i);
      expect = slot_pos[s];
      prev_slot = s;
    }
    if (b.pos[i] != expect)
      fail("step: row {}: position {} does not continue slot {} (expected {})", i, b.pos[i], s, expect);
    if (b.pos[i] >= shape.max_ctx)
      fail("step: slot {}: position {} is past the reserved context of {} tokens", s, b.pos[i], shape.max_ctx);
    ++expect;
  }
}

bool device_available(Device d) {
  if (d == Device::CPU) return true;
#if CLAWMINE_HAVE_CUDA
  return cuda_backend_available();
#else
  return false;
#endif
}

void check_backend_options(const BackendOptions& opt) {
  const double u = opt.gpu_memory_utilization;
  if (!(u > 0 && u <= 1)) fail("gpu_memory_utilization must be in (0, 1] (got {})", u);
}

std::unique_ptr<ModelBackend> make_backend(const Model& m, Device d, const BackendOptions& opt) {
  check_backend_options(opt);
  if (d == Device::CPU) return make_cpu_backend(m, opt);
#if CLAWMINE_HAVE_CUDA
  if (!cuda_backend_available()) fail("--device cuda: no CUDA device is present (the CPU backend is --device cpu)");
  return make_cuda_backend(m, opt);
#else
  fail("--device cuda: the CUDA model backend is not available in this build (configured without CUDA)");
#endif
}

}  // namespace cm
