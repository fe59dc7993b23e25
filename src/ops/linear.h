// Linear layers: y[m, n] = sum_k x[m, k] * W[n, k]  (W stored [out, in], row-major).
//
// The storage format is a property of each weight, not of the model: one
// checkpoint may mix BF16 attention, FP8-block shared experts and NVFP4 routed
// experts. Weights stay in their stored format in memory (usually pointers into
// the mmap'd checkpoint); kernels expand rows/blocks on the fly. Dimension
// convention everywhere: row-major, the last axis is contiguous.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "common/dtype.h"

namespace cm {

enum class WeightFormat : uint8_t {
  F32,        // data: f32 [N, K]
  BF16,       // data: bf16 [N, K]
  F16,        // data: f16 [N, K]
  NVFP4,      // data: u8 [N, K/2] (2x E2M1, low nibble = even k); scale: E4M3 [N, K/16]; scale_2: f32
  MXFP4,      // data: i8 [N, K/2] (2x E2M1, low nibble = even k); scale: E8M0 [N, K/32]
  FP8_BLOCK,  // data: E4M3 [N, K]; scale: E8M0 or F32 [ceil(N/128), ceil(K/128)]
};
const char* weight_format_name(WeightFormat f);

// One linear weight, in its stored form. Non-owning views into the checkpoint
// unless `owned` holds the bytes (repacked or generated weights).
struct LinearWeight {
  std::string name;  // checkpoint prefix, e.g. "layers.3.attn.wq_a"
  WeightFormat format = WeightFormat::F32;
  int64_t out_features = 0;  // N
  int64_t in_features = 0;   // K
  const uint8_t* data = nullptr;
  const uint8_t* scale = nullptr;  // block scales (format-specific layout, see WeightFormat)
  DType scale_dtype = DType::F8_E8M0;
  int64_t scale_rows = 0, scale_cols = 0;
  float scale_2 = 1.0f;      // NVFP4 per-tensor scale (weight_scale_2)
  float input_scale = 0.0f;  // NVFP4 calibrated activation scale (0 = absent)
  std::vector<uint8_t> owned;
  std::vector<uint8_t> owned_scale;

  LinearWeight() = default;
  LinearWeight(LinearWeight&&) = default;  // vector moves keep their buffers, so data stays valid
  LinearWeight& operator=(LinearWeight&&) = default;
  LinearWeight(const LinearWeight&) = delete;  // a copy would point into the other's buffer
  LinearWeight& operator=(const LinearWeight&) = delete;

  bool empty() const { return data == nullptr; }
  size_t stored_bytes() const;  // bytes of data + scales, as held in memory
};

// Writes W[n, 0:K] as fp32 into out[0:K]. Exact for every format (the
// products E2M1 x E4M3 x f32 are computed in fp32).
void linear_expand_row(const LinearWeight& w, int64_t n, float* out);

// Activation handling inside CPU linears (see ops/linear_cpu.cpp).
enum class ActQuant : uint8_t { NONE, NVFP4 };

// y[M, N] = x[M, K] * W^T in fp32 (OpenMP over weight-row blocks and, when
// those are few, activation-row chunks). Every output element is computed with
// one fixed arithmetic whatever M or the tiling (see linear.cpp): a row's result
// does not depend on the other rows of the call.
void linear_cpu(const LinearWeight& w, const float* x, int64_t m, float* y, ActQuant aq = ActQuant::NONE);

// Rows [row0, row0+rows) of W only: y[M, rows] = x[M, K] · W[row0:row0+rows]ᵀ
// (the grouped output projection uses one row block per group).
void linear_cpu_rows(const LinearWeight& w, int64_t row0, int64_t rows, const float* x, int64_t m, float* y,
                     ActQuant aq = ActQuant::NONE);
// Same with row strides: x rows ldx floats apart, y rows ldy floats apart.
void linear_cpu_rows(const LinearWeight& w, int64_t row0, int64_t rows, const float* x, int64_t ldx, int64_t m,
                     float* y, int64_t ldy, ActQuant aq = ActQuant::NONE);

// The same fixed-arithmetic GEMM on plain fp32 rows, y[i, j] = x[i, :]·w_j
// (row j of w given by pointer; y rows ldy apart). Serial: for use inside
// per-token parallel loops (attention scores, indexer scores).
void gemm_f32_rows(const float* x, int64_t ldx, int64_t m, const float* const* w_rows, int64_t n, int64_t k, float* y,
                   int64_t ldy);
// y[m, n] = x[m, k] · w[n, k]ᵀ over contiguous fp32 matrices, OpenMP-parallel.
void gemm_f32(const float* x, int64_t m, const float* w, int64_t n, int64_t k, float* y);

// Sizes every OpenMP thread's expansion panel for weights of up to max_k
// inputs and the W4A4 buffer for max_m rows, so later calls allocate nothing.
void linear_cpu_reserve(int64_t max_k, int64_t max_m);

// Builds an owned F32 weight (tests, generated models).
LinearWeight linear_from_f32(std::string name, int64_t n, int64_t k, const float* values);

}  // namespace cm
