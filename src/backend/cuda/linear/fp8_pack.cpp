// Repacking of FP8 128x128-block weights for the Hopper kernels (layout in fp8_pack.h).
#include "backend/cuda/linear/fp8_pack.h"

#include <cmath>
#include <cstring>

#include "common/error.h"
#include "common/numeric.h"

namespace cm::cuda {

namespace {

// Block scale i as fp32, refusing what no kernel can apply (NaN, Inf, zero).
float checked_scale(const LinearWeight& w, int64_t i, int64_t cols) {
  float s;
  if (w.scale_dtype == DType::F32) {
    s = f32_from_bytes(w.scale + 4 * i);
  } else {
    CM_CHECK(w.scale[i] != 0xff, "linear '{}': FP8 block scale ({}, {}) is the E8M0 NaN code 0xFF", w.name, i / cols,
             i % cols);
    s = e8m0_to_f32(w.scale[i]);
  }
  CM_CHECK(std::isfinite(s) && s != 0.0f, "linear '{}': FP8 block scale ({}, {}) is {} (must be finite and nonzero)",
           w.name, i / cols, i % cols, s);
  return s;
}

// True when s = +-2^j with j in [kFp8Pow2Min, kFp8Pow2Max].
bool exact_pow2(float s) {
  int ex = 0;
  const float f = std::frexp(std::fabs(s), &ex);  // s = f * 2^ex, f in [0.5, 1)
  return f == 0.5f && ex - 1 >= kFp8Pow2Min && ex - 1 <= kFp8Pow2Max;
}

}  // namespace

Fp8Packed pack_fp8(const LinearWeight& w) {
  CM_CHECK(w.format == WeightFormat::FP8_BLOCK, "linear '{}': expected an FP8-block weight, got {}", w.name,
           weight_format_name(w.format));
  const int64_t N = w.out_features, K = w.in_features;
  CM_CHECK(N > 0 && K > 0 && K % 16 == 0, "linear '{}': FP8 on the GPU needs N > 0 and K divisible by 16, got [{}, {}]",
           w.name, N, K);
  CM_CHECK(w.data && w.scale, "linear '{}': FP8 weight without data or scales", w.name);
  CM_CHECK(w.scale_dtype == DType::F8_E8M0 || w.scale_dtype == DType::F32,
           "linear '{}': FP8 block scales must be F8_E8M0 or F32, got {}", w.name, dtype_name(w.scale_dtype));
  Fp8Packed p;
  p.N = N;
  p.K = K;
  p.row_blocks = (N + 15) / 16;
  p.chunks = (K + 63) / 64;
  p.scale_rows = (N + 127) / 128;
  p.scale_cols = (K + 127) / 128;
  CM_CHECK(w.scale_rows == p.scale_rows && w.scale_cols == p.scale_cols,
           "linear '{}': FP8 scale shape [{}, {}], expected [{}, {}]", w.name, w.scale_rows, w.scale_cols, p.scale_rows,
           p.scale_cols);
  p.scales.resize(size_t(p.scale_rows * p.scale_cols));
  p.pow2_scales = true;
  for (int64_t i = 0; i < p.scale_rows * p.scale_cols; ++i) {
    p.scales[size_t(i)] = checked_scale(w, i, p.scale_cols);
    p.pow2_scales = p.pow2_scales && exact_pow2(p.scales[size_t(i)]);
  }
  for (int64_t i = 0; i < N * K; ++i)
    CM_CHECK(!e4m3_is_nan(w.data[i]), "linear '{}': E4M3 NaN code at row {}, column {}", w.name, i / K, i % K);
  p.data.assign(size_t(p.row_blocks * p.chunks) * 1024, 0);
#pragma omp parallel for schedule(static)
  for (int64_t rb = 0; rb < p.row_blocks; ++rb)
    for (int64_t c = 0; c < p.chunks; ++c) {
      uint8_t* dst = p.data.data() + size_t(rb * p.chunks + c) * 1024;
      for (int h = 0; h < 2; ++h)
        for (int lane = 0; lane < 32; ++lane) {
          const int64_t n = rb * 16 + lane / 4 + 8 * h, k0 = c * 64 + 16 * (lane % 4);
          if (n >= N || k0 >= K) continue;  // K % 16 == 0: a lane's 16 codes are all in or all out
          std::memcpy(dst + h * 512 + lane * 16, w.data + n * K + k0, 16);
        }
    }
  return p;
}

float packed_fp8_value(const Fp8Packed& p, int64_t n, int64_t k) {
  const int64_t rb = n / 16, r = n % 16, c = k / 64, t = (k % 64) / 16;
  const int64_t lane = (r % 8) * 4 + t, h = r / 8;
  const uint8_t code = p.data[size_t(rb * p.chunks + c) * 1024 + size_t(h * 512 + lane * 16 + k % 16)];
  return e4m3_to_f32(code) * p.scales[size_t((n / 128) * p.scale_cols + k / 128)];
}

}  // namespace cm::cuda
