// The factory (factory.h): the one file that includes every backend.
#include "factory/factory.h"

#include <unistd.h>

#include "common/error.h"
#include "backend/cpu/cpu_backend.h"
#include "model/model.h"
#if CLAWMINE_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace cm {

bool gpu_present() {
#ifdef CLAWMINE_HAVE_CUDA
  return ::access("/dev/nvidiactl", F_OK) == 0 || ::access("/dev/nvidia0", F_OK) == 0;
#else
  return false;
#endif
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
