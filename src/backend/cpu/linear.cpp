// CPU linear kernels. Each thread expands a tile of weight rows to fp32 once
// and dots it against all M activation rows, so the weight is read once per
// call whatever M is (decode and prefill share the code). Formats with block
// scales expand one row at a time through linear_expand_row.
#include <omp.h>

#include <algorithm>
#include <cstring>

#include "common/error.h"
#include "common/numeric.h"
#include "ops/linear.h"

namespace cm {

const char* weight_format_name(WeightFormat f) {
  switch (f) {
    case WeightFormat::F32: return "F32";
    case WeightFormat::BF16: return "BF16";
    case WeightFormat::F16: return "F16";
    case WeightFormat::NVFP4: return "NVFP4";
    case WeightFormat::MXFP4: return "MXFP4";
    case WeightFormat::FP8_BLOCK: return "FP8-block";
  }
  return "?";
}

size_t LinearWeight::stored_bytes() const {
  size_t n = size_t(out_features) * size_t(in_features);
  size_t d = 0;
  switch (format) {
    case WeightFormat::F32: d = n * 4; break;
    case WeightFormat::BF16:
    case WeightFormat::F16: d = n * 2; break;
    case WeightFormat::NVFP4:
    case WeightFormat::MXFP4: d = n / 2; break;
    case WeightFormat::FP8_BLOCK: d = n; break;
  }
  return d + size_t(scale_rows * scale_cols) * (scale ? dtype_size(scale_dtype) : 0) + (scale_2 != 1.0f ? 4 : 0);
}

void linear_expand_row(const LinearWeight& w, int64_t n, float* out) {
  const int64_t K = w.in_features;
  switch (w.format) {
    case WeightFormat::F32:
      std::memcpy(out, w.data + size_t(n * K) * 4, size_t(K) * 4);
      return;
    case WeightFormat::BF16: {
      const uint16_t* p = reinterpret_cast<const uint16_t*>(w.data) + n * K;
      for (int64_t k = 0; k < K; ++k) out[k] = bf16_to_f32(p[k]);
      return;
    }
    case WeightFormat::F16: {
      const uint16_t* p = reinterpret_cast<const uint16_t*>(w.data) + n * K;
      for (int64_t k = 0; k < K; ++k) out[k] = f16_to_f32(p[k]);
      return;
    }
    case WeightFormat::NVFP4: {
      const uint8_t* q = w.data + n * (K / 2);
      const uint8_t* s = w.scale + n * (K / 16);
      for (int64_t b = 0; b < K / 16; ++b) {
        float sc = e4m3_to_f32(s[b]) * w.scale_2;
        for (int64_t j = 0; j < 8; ++j) {
          uint8_t byte = q[b * 8 + j];
          out[b * 16 + 2 * j] = e2m1_to_f32(byte & 0xf) * sc;
          out[b * 16 + 2 * j + 1] = e2m1_to_f32(byte >> 4) * sc;
        }
      }
      return;
    }
    case WeightFormat::MXFP4: {
      const uint8_t* q = w.data + n * (K / 2);
      const uint8_t* s = w.scale + n * (K / 32);
      for (int64_t b = 0; b < K / 32; ++b) {
        float sc = e8m0_to_f32(s[b]);
        for (int64_t j = 0; j < 16; ++j) {
          uint8_t byte = q[b * 16 + j];
          out[b * 32 + 2 * j] = e2m1_to_f32(byte & 0xf) * sc;
          out[b * 32 + 2 * j + 1] = e2m1_to_f32(byte >> 4) * sc;
        }
      }
      return;
    }
    case WeightFormat::FP8_BLOCK: {
      const uint8_t* q = w.data + n * K;
      const int64_t sr = n / 128;
      for (int64_t k = 0; k < K; ++k) {
        int64_t sc_idx = sr * w.scale_cols + k / 128;
        float sc = w.scale_dtype == DType::F32 ? reinterpret_cast<const float*>(w.scale)[sc_idx]
                                               : e8m0_to_f32(w.scale[sc_idx]);
        out[k] = e4m3_to_f32(q[k]) * sc;
      }
      return;
    }
  }
  fail("linear '{}': unknown weight format", w.name);
}

void linear_cpu(const LinearWeight& w, const float* x, int64_t m, float* y, ActQuant aq) {
  linear_cpu_rows(w, 0, w.out_features, x, m, y, aq);
}

void linear_cpu_rows(const LinearWeight& w, int64_t row0, int64_t N, const float* x, int64_t m, float* y,
                     ActQuant aq) {
  const int64_t K = w.in_features;
  CM_CHECK(row0 >= 0 && N >= 0 && row0 + N <= w.out_features, "linear '{}': rows [{}, {}) outside [0, {})", w.name,
           row0, row0 + N, w.out_features);
  // Activation quantization only applies to NVFP4 weights; others are weight-only.
  CM_CHECK(aq == ActQuant::NONE || w.format != WeightFormat::NVFP4,
           "linear '{}': NVFP4 activation quantization is not available on this path", w.name);
  if (m <= 0 || N <= 0) return;
  // Threads only pay off above ~64k multiply-adds; below, fork/join dominates.
  const bool par = N * K * m >= (int64_t(1) << 16);
#pragma omp parallel if (par)
  {
    std::vector<float> row(size_t(K) + 16);
#pragma omp for schedule(static)
    for (int64_t r = 0; r < N; ++r) {
      const int64_t n = row0 + r;
      const float* wr;
      if (w.format == WeightFormat::F32) {
        wr = reinterpret_cast<const float*>(w.data) + n * K;
      } else {
        linear_expand_row(w, n, row.data());
        wr = row.data();
      }
      for (int64_t i = 0; i < m; ++i) {
        const float* xr = x + i * K;
        float acc0 = 0, acc1 = 0, acc2 = 0, acc3 = 0;
        int64_t k = 0;
        for (; k + 4 <= K; k += 4) {
          acc0 += xr[k] * wr[k];
          acc1 += xr[k + 1] * wr[k + 1];
          acc2 += xr[k + 2] * wr[k + 2];
          acc3 += xr[k + 3] * wr[k + 3];
        }
        for (; k < K; ++k) acc0 += xr[k] * wr[k];
        y[i * N + r] = (acc0 + acc1) + (acc2 + acc3);
      }
    }
  }
}

LinearWeight linear_from_f32(std::string name, int64_t n, int64_t k, const float* values) {
  LinearWeight w;
  w.name = std::move(name);
  w.format = WeightFormat::F32;
  w.out_features = n;
  w.in_features = k;
  w.owned.resize(size_t(n * k) * 4);
  std::memcpy(w.owned.data(), values, w.owned.size());
  w.data = w.owned.data();
  return w;
}

}  // namespace cm
