// Statistics of a named intermediate (--layer-stats, the first-non-finite
// check): amax and mean over the finite values, NaN / Inf / finite counts.
// The CPU op (src/backend/cpu/stats.cpp) and the CUDA op
// (src/backend/cuda/stats.cu) read the same segments: `rows` segments of `len`
// values, segment r starting at x + r·stride (a whole tensor: rows 1; stream k
// of X [T, hc, D]: x + k·D, rows T, len D, stride hc·D). On the device the
// result goes into a reserved device buffer and is read after the step, so the
// step stays graph-capturable; its reduction has a fixed order (same bits twice).
#pragma once
#include <cstdint>

namespace cm {

struct TensorStats {
  float amax = 0;
  double mean = 0;
  int64_t nan = 0, inf = 0, count = 0;  // count: finite values
};

TensorStats tensor_stats_cpu(const float* x, int64_t rows, int64_t len, int64_t stride);
// A whole contiguous tensor of `count` values.
inline TensorStats tensor_stats(const float* x, int64_t count) { return tensor_stats_cpu(x, 1, count, count); }

// The device result: the sum instead of the mean (mean = sum / count).
struct DeviceTensorStats {
  float amax = 0;
  float unused = 0;
  double sum = 0;
  long long nan = 0, inf = 0, count = 0;
};

inline TensorStats to_tensor_stats(const DeviceTensorStats& d) {
  TensorStats s;
  s.amax = d.amax;
  s.mean = d.count ? d.sum / double(d.count) : 0.0;
  s.nan = d.nan;
  s.inf = d.inf;
  s.count = d.count;
  return s;
}

// --- CUDA (src/backend/cuda/stats.cu): x is f32, or bf16 (the bf16 overload)
// in device memory; out: one DeviceTensorStats in device memory. ---
namespace cuda {
class Context;
}
void tensor_stats_cuda(cuda::Context& ctx, const float* x, int64_t rows, int64_t len, int64_t stride,
                       DeviceTensorStats* out);
void tensor_stats_cuda(cuda::Context& ctx, const uint16_t* x_bf16, int64_t rows, int64_t len, int64_t stride,
                       DeviceTensorStats* out);

}  // namespace cm
