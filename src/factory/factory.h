// Makes the backend a caller runs, from a model, a device and the options (seam/backend.h). The
// only place that knows every backend: callers above (runtime, serve, cli) include this and the
// seam, never a backend.
#pragma once
#include <memory>

#include "seam/backend.h"

namespace cm {

struct Model;

// True when make_backend can make a backend for d here (CUDA: a CUDA build and a device present;
// initialises CUDA to ask).
bool device_available(Device d);

// True when this build has the CUDA backend and the machine shows an NVIDIA
// device node. Cheap: it does not initialise CUDA (a CPU run never pays for it).
bool gpu_present();

// Throws naming the field when an option is out of range (gpu_memory_utilization outside (0, 1]).
void check_backend_options(const BackendOptions& opt);

// The backend for a device (its options checked first). CUDA throws when the build has no CUDA or no GPU is present.
std::unique_ptr<ModelBackend> make_backend(const Model& m, Device d, const BackendOptions& opt = {});

}  // namespace cm
