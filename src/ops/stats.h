// Statistics of a named intermediate on the device (--layer-stats on the GPU,
// and the first-non-finite check): the same numbers as tensor_stats in
// model/observer.h — amax and sum over the finite values, NaN/Inf/finite
// counts — computed into a reserved device buffer and read after the step,
// so the step stays graph-capturable. Fixed-order reduction: same bits twice.
#pragma once
#include <cstdint>

namespace cm {

struct DeviceTensorStats {
  float amax = 0;
  float unused = 0;
  double sum = 0;  // mean = sum / count
  long long nan = 0, inf = 0, count = 0;
};

// --- CUDA (src/backend/cuda/stats.cu). Over `rows` segments of `len` f32
// values, segment r starting at x + r·stride (a whole tensor: rows = 1; one
// hyper-connection stream k of X [T, hc, D]: x + k·D, rows T, len D, stride
// hc·D). out: one DeviceTensorStats in device memory. ---
namespace cuda {
class Context;
}
void tensor_stats_cuda(cuda::Context& ctx, const float* x, int64_t rows, int64_t len, int64_t stride,
                       DeviceTensorStats* out);

}  // namespace cm
