// A model linear in any stored format: its upload and the one call the step makes (linear.h).
//
// A row's result must never depend on how many rows share the call: FP8 linears run the decode
// kernel below kFp8PrefillMinM rows and the prefill kernel from there, NVFP4 linears the decode
// kernel below kNvfp4TilesMinRows rows and the mma.sync prefill kernel from there; each prefill
// kernel gives the decode kernel's bits for every row (the other prefill kernels, wgmma and
// dequant + cuBLAS, sum in other orders and run only under --fast-prefill).
#include <algorithm>
#include <cstdint>
#include <vector>

#include "backend/cuda/core/cuda_errors.h"
#include "backend/cuda/linear/linear.h"
#include "backend/cuda/step/step_kernels.h"

namespace cm::cuda {

DevLinear upload_linear(const LinearWeight& w, int groups) {
  DevLinear d;
  if (w.empty()) return d;
  d.name = w.name;
  d.format = w.format;
  d.N = w.out_features;
  d.K = w.in_features;
  d.groups = groups;
  CM_CU_CHECK(d.N % groups == 0, "linear '%s': %lld rows do not split into %d groups", w.name.c_str(),
              (long long)d.N, groups);
  switch (w.format) {
    case WeightFormat::F32:
    case WeightFormat::BF16: {
      const size_t bytes = size_t(d.N * d.K) * (w.format == WeightFormat::F32 ? 4 : 2);
      d.dense.alloc(bytes);
      d.dense.upload(w.data, bytes);
      break;
    }
    case WeightFormat::F16: {  // no F16 kernel: expanded to f32 (exact)
      std::vector<float> rows(size_t(d.N * d.K));
      for (int64_t n = 0; n < d.N; ++n) linear_expand_row(w, n, rows.data() + n * d.K);
      d.format = WeightFormat::F32;
      d.dense.alloc(rows.size() * 4);
      d.dense.upload(rows.data(), rows.size() * 4);
      break;
    }
    case WeightFormat::NVFP4:
    case WeightFormat::MXFP4:
      d.fp4 = std::make_unique<DeviceLinear>(upload_nvfp4(w, groups));
      break;
    case WeightFormat::FP8_BLOCK:
      d.fp8 = std::make_unique<DeviceFp8Linear>(upload_fp8(w, groups));
      break;
  }
  return d;
}

size_t DevLinear::bytes() const {
  return dense.size() + (fp4 ? fp4->device_bytes() : 0) + (fp8 ? fp8->device_bytes() : 0);
}

void run_linear(Context& ctx, const DevLinear& w, const void* x, bool x_bf16, int64_t M, int64_t ldx, void* y,
                bool y_bf16, int64_t ldy, uint16_t* cast_scratch, bool batch_invariant) {
  if (M <= 0) return;
  CM_CU_CHECK(!w.empty(), "run_linear: empty weight");
  if (!w.wants_bf16_input()) {
    dense_linear(ctx, w.dense.get(), w.format == WeightFormat::BF16, w.N, w.K, w.groups, x, x_bf16, M, ldx, y, y_bf16,
                 ldy, 1.0f);
    return;
  }
  const uint16_t* xb = static_cast<const uint16_t*>(x);
  if (!x_bf16) {
    const int64_t cols = w.K * w.groups;
    cast_f32_bf16(ctx, static_cast<const float*>(x), ldx, M, cols, cast_scratch, cols);
    xb = cast_scratch;
    ldx = cols;
  }
  const OutType out = y_bf16 ? OutType::BF16 : OutType::F32;
  if (!batch_invariant && M > kGraphMaxRows) {  // --fast-prefill: expanded panels through cuBLAS
    if (w.fp4)
      linear_nvfp4(ctx, *w.fp4, xb, M, ldx, y, ldy, out, kGraphMaxRows, PrefillKernel::DequantCublas);
    else
      linear_fp8(ctx, *w.fp8, xb, M, ldx, y, ldy, out, kGraphMaxRows, Fp8Prefill::Fast);
    return;
  }
  if (w.fp4)
    linear_nvfp4(ctx, *w.fp4, xb, M, ldx, y, ldy, out, kNvfp4TilesMinRows - 1, PrefillKernel::MmaTiles);
  else
    linear_fp8(ctx, *w.fp8, xb, M, ldx, y, ldy, out, kFp8PrefillMinM - 1, Fp8Prefill::Exact);  // decode bits
}

bool run_linear_pair(Context& ctx, const DevLinear& a, const DevLinear& b, const uint16_t* x, int64_t M, float* y_a,
                     float* y_b) {
  // Only where run_linear would run the decode kernels (M below both prefill thresholds; the pairs take
  // M <= 32 anyway).
  if (M <= 0 || M >= std::min(kNvfp4TilesMinRows, kFp8PrefillMinM)) return false;
  if (a.fp8 && b.fp8)
    return linear_fp8_pair(ctx, *a.fp8, *b.fp8, x, M, a.K, y_a, a.N, y_b, b.N, OutType::F32);
  if (a.fp4 && b.fp4)
    return linear_nvfp4_pair(ctx, *a.fp4, *b.fp4, x, M, a.K, y_a, a.N, y_b, b.N, OutType::F32);
  return false;
}

}  // namespace cm::cuda
