// RMSNorm (spec §2): y = w ⊙ x / sqrt(mean(x²) + eps), statistics in fp32.
// Unweighted when w is null. Applied independently to `rows` vectors of `dim`.
#pragma once
#include <cstdint>

namespace cm {

void rms_norm_cpu(const float* x, const float* w, int64_t rows, int64_t dim, float eps, float* y);

}  // namespace cm
