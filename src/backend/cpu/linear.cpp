// CPU linear kernels. Each thread expands a tile of weight rows to fp32 once
// and dots it against all M activation rows, so the weight is read once per
// call whatever M is (decode and prefill share the code). Formats with block
// scales expand one row at a time through linear_expand_row.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/error.h"
#include "common/numeric.h"
#include "ops/linear.h"
#include "quant/codec.h"

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

// NVFP4 row n as e2m1 * e4m3(block scale) * mul: mul = weight_scale_2 gives
// the weight; mul = 1 gives the block-unit values the W4A4 path multiplies
// by alpha afterwards.
static void expand_nvfp4_row(const LinearWeight& w, int64_t n, float mul, float* out) {
  const int64_t K = w.in_features;
  const uint8_t* q = w.data + n * (K / 2);
  const uint8_t* s = w.scale + n * (K / 16);
  for (int64_t b = 0; b < K / 16; ++b) {
    float sc = e4m3_to_f32(s[b]) * mul;
    for (int64_t j = 0; j < 8; ++j) {
      uint8_t byte = q[b * 8 + j];
      out[b * 16 + 2 * j] = e2m1_to_f32(byte & 0xf) * sc;
      out[b * 16 + 2 * j + 1] = e2m1_to_f32(byte >> 4) * sc;
    }
  }
}

void linear_expand_row(const LinearWeight& w, int64_t n, float* out) {
  const int64_t K = w.in_features;
  switch (w.format) {
    case WeightFormat::F32:
      std::memcpy(out, w.data + size_t(n * K) * 4, size_t(K) * 4);
      return;
    case WeightFormat::BF16: {
      const uint8_t* p = w.data + 2 * n * K;  // safetensors data need not be 2-byte aligned
      for (int64_t k = 0; k < K; ++k) out[k] = bf16_to_f32(uint16_t(p[2 * k] | (p[2 * k + 1] << 8)));
      return;
    }
    case WeightFormat::F16: {
      const uint8_t* p = w.data + 2 * n * K;
      for (int64_t k = 0; k < K; ++k) out[k] = f16_to_f32(uint16_t(p[2 * k] | (p[2 * k + 1] << 8)));
      return;
    }
    case WeightFormat::NVFP4:
      expand_nvfp4_row(w, n, w.scale_2, out);
      return;
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
        float sc = w.scale_dtype == DType::F32 ? f32_from_bytes(w.scale + 4 * sc_idx)
                                               : e8m0_to_f32(w.scale[sc_idx]);
        out[k] = e4m3_to_f32(q[k]) * sc;
      }
      return;
    }
  }
  fail("linear '{}': unknown weight format", w.name);
}

// W4A4 emulation (spec §9.5, --act-quant nvfp4): each activation row is
// quantized as a Blackwell kernel would (g = 1/input_scale, per-16 E4M3
// satfinite block scales, E2M1 RNE) and kept as e2m1 * dec(s_xb); the weight
// row as e2m1 * dec(s_wb). Both products are exact in fp32, so
// sum_k x'_k w'_k = sum_b s_xb s_wb sum q_x q_w, then y = alpha * that with
// alpha = input_scale * weight_scale_2. Only NVFP4 weights take this path.
static std::vector<float> nvfp4_quantized_activations(const LinearWeight& w, const float* x, int64_t m) {
  const int64_t K = w.in_features;
  CM_CHECK(std::isfinite(w.input_scale) && w.input_scale > 0.0f,
           "linear '{}': --act-quant nvfp4 needs a finite input_scale > 0 (got {})", w.name, w.input_scale);
  std::vector<float> xq(size_t(m * K));
  std::vector<uint8_t> codes(static_cast<size_t>(K)), scales(static_cast<size_t>(K / 16));
  for (int64_t i = 0; i < m; ++i) {
    nvfp4_quantize_activation(x + i * K, K, w.input_scale, codes.data(), scales.data());
    for (int64_t k = 0; k < K; ++k) xq[size_t(i * K + k)] = e2m1_to_f32(codes[size_t(k)]) * e4m3_to_f32(scales[size_t(k / 16)]);
  }
  return xq;
}

// fp32 dot product, vectorised (AVX2/FMA clone chosen at run time where the
// CPU has it, plain SSE2 otherwise).
__attribute__((target_clones("arch=x86-64-v3", "default"))) static float dot_f32(const float* a, const float* b,
                                                                                 int64_t n) {
  float acc = 0;
#pragma omp simd reduction(+ : acc)
  for (int64_t k = 0; k < n; ++k) acc += a[k] * b[k];
  return acc;
}

void linear_cpu(const LinearWeight& w, const float* x, int64_t m, float* y, ActQuant aq) {
  linear_cpu_rows(w, 0, w.out_features, x, m, y, aq);
}

void linear_cpu_rows(const LinearWeight& w, int64_t row0, int64_t N, const float* x, int64_t m, float* y,
                     ActQuant aq) {
  const int64_t K = w.in_features;
  CM_CHECK(row0 >= 0 && N >= 0 && row0 + N <= w.out_features, "linear '{}': rows [{}, {}) outside [0, {})", w.name,
           row0, row0 + N, w.out_features);
  if (m <= 0 || N <= 0) return;
  if (w.input_observer) w.input_observer->observe_input(w, x, m);
  // Weight-only formats ignore the activation mode (there is no W4A4 kernel for them).
  const bool w4a4 = aq == ActQuant::NVFP4 && w.format == WeightFormat::NVFP4;
  std::vector<float> xq;
  float out_mul = 1.0f;
  if (w4a4) {
    xq = nvfp4_quantized_activations(w, x, m);
    x = xq.data();
    out_mul = w.input_scale * w.scale_2;
  }
  // F32 rows are used in place when 4-byte aligned (safetensors does not promise it).
  const bool f32_direct = w.format == WeightFormat::F32 && reinterpret_cast<uintptr_t>(w.data) % 4 == 0;
  // Threads only pay off above ~64k multiply-adds; below, fork/join dominates.
  const bool par = N * K * m >= (int64_t(1) << 16);
#pragma omp parallel if (par)
  {
    std::vector<float> row(size_t(K) + 16);
#pragma omp for schedule(static)
    for (int64_t r = 0; r < N; ++r) {
      const int64_t n = row0 + r;
      const float* wr;
      if (f32_direct) {
        wr = reinterpret_cast<const float*>(w.data) + n * K;  // aligned: checked above
      } else {
        if (w4a4) expand_nvfp4_row(w, n, 1.0f, row.data());
        else linear_expand_row(w, n, row.data());
        wr = row.data();
      }
      for (int64_t i = 0; i < m; ++i) {
        const float* xr = x + i * K;
        float acc = dot_f32(xr, wr, K);
        y[i * N + r] = w4a4 ? acc * out_mul : acc;
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
