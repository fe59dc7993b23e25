// CPU linear kernels. Each task expands a block of weight rows to fp32 once
// and multiplies it against its chunk of activation rows (all M rows unless
// there are too few weight blocks to go round the threads), so decode and
// prefill share one code path. Formats with block scales expand one row at a
// time through linear_expand_row.
#include <immintrin.h>
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
namespace {
// Decode tables: a packed byte's two E2M1 values, and every E4M3 / E8M0 byte.
struct DecodeTables {
  float pair[256][2];
  float e4m3[256];
  float e8m0[256];
  DecodeTables() {
    for (int b = 0; b < 256; ++b) {
      pair[b][0] = e2m1_to_f32(uint8_t(b & 0xf));
      pair[b][1] = e2m1_to_f32(uint8_t(b >> 4));
      e4m3[b] = e4m3_to_f32(uint8_t(b));
      e8m0[b] = e8m0_to_f32(uint8_t(b));
    }
  }
};
const DecodeTables& tables() {
  static const DecodeTables t;
  return t;
}

// Packed E2M1 row with one scale per `block` values: out = e2m1 · scale[b].
inline void expand_fp4(const uint8_t* q, const float* scales, int64_t K, int64_t block, float* out) {
  const DecodeTables& t = tables();
  for (int64_t b = 0; b < K / block; ++b) {
    const float sc = scales[b];
    for (int64_t j = 0; j < block / 2; ++j) {
      const float* v = t.pair[q[b * block / 2 + j]];
      out[b * block + 2 * j] = v[0] * sc;
      out[b * block + 2 * j + 1] = v[1] * sc;
    }
  }
}
}  // namespace

// NVFP4 row n as e2m1 * e4m3(block scale) * mul: mul = weight_scale_2 gives
// the weight; mul = 1 gives the block-unit values the W4A4 path multiplies
// by alpha afterwards.
static void expand_nvfp4_row(const LinearWeight& w, int64_t n, float mul, float* out) {
  const int64_t K = w.in_features;
  const uint8_t* s = w.scale + n * (K / 16);
  float sc[512];  // K/16 scales per chunk of 8192 values
  for (int64_t k0 = 0; k0 < K; k0 += 8192) {
    const int64_t kn = std::min<int64_t>(8192, K - k0);
    for (int64_t b = 0; b < kn / 16; ++b) sc[b] = tables().e4m3[s[k0 / 16 + b]] * mul;
    expand_fp4(w.data + n * (K / 2) + k0 / 2, sc, kn, 16, out + k0);
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
      const uint8_t* s = w.scale + n * (K / 32);
      float sc[256];  // K/32 scales per chunk of 8192 values
      for (int64_t k0 = 0; k0 < K; k0 += 8192) {
        const int64_t kn = std::min<int64_t>(8192, K - k0);
        for (int64_t b = 0; b < kn / 32; ++b) sc[b] = tables().e8m0[s[k0 / 32 + b]];
        expand_fp4(w.data + n * (K / 2) + k0 / 2, sc, kn, 32, out + k0);
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
static void nvfp4_quantized_activations(const LinearWeight& w, const float* x, int64_t ldx, int64_t m, float* xq) {
  const int64_t K = w.in_features;
  CM_CHECK(std::isfinite(w.input_scale) && w.input_scale > 0.0f,
           "linear '{}': --act-quant nvfp4 needs a finite input_scale > 0 (got {})", w.name, w.input_scale);
  uint8_t codes[16], scale;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t b = 0; b < K / 16; ++b) {
      nvfp4_quantize_activation(x + i * ldx + b * 16, 16, w.input_scale, codes, &scale);  // one 16-block
      const float s = e4m3_to_f32(scale);
      for (int64_t j = 0; j < 16; ++j) xq[i * K + b * 16 + j] = e2m1_to_f32(codes[j]) * s;
    }
}

// ---------------------------------------------------------------------------
// The GEMM. y[i, n] = Σ_k x[i, k]·W[n, k] with one fixed arithmetic per output
// element, whatever M, N, the tiling or the thread count: eight fp32 lanes
// accumulate k ≡ j (mod 8) in k order with FMA (the tail of K is masked in as
// zeros), then the lanes are summed in one fixed tree. So a row's result never
// depends on which other rows share the call: the CPU backend is batch-invariant
// (a sequence gives the same bits alone and in any batch) by construction.
//
// Tiles of R activation rows × C weight rows keep R·C accumulators in registers
// (3×4 for prefill, 1×8 for decode: 12 or 8 independent FMA chains). Quantized
// weights are expanded to fp32 once per block of kBlockRows rows per task and
// reused against every activation row of the task.

namespace {

constexpr int64_t kBlockRows = 16;

// Lane sum in a fixed order: ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)).
inline float lane_sum(const float l[8]) {
  float a0 = l[0] + l[4], a1 = l[1] + l[5], a2 = l[2] + l[6], a3 = l[3] + l[7];
  return (a0 + a2) + (a1 + a3);
}

// Portable tile with the same arithmetic as the AVX2 one (used where the CPU lacks AVX2/FMA).
template <int R, int C>
void tile_scalar(const float* x, int64_t ldx, const float* const* wr, int64_t K, float* y, int64_t ldy, float mul) {
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) {
      float l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      const float* xr = x + r * ldx;
      for (int64_t k = 0; k < K; ++k) l[k & 7] = std::fma(xr[k], wr[c][k], l[k & 7]);
      y[r * ldy + c] = lane_sum(l) * mul;
    }
}

__attribute__((target("avx2,fma"))) inline float lane_sum_avx(__m256 v) {
  alignas(32) float l[8];
  _mm256_store_ps(l, v);
  return lane_sum(l);
}

template <int R, int C>
__attribute__((target("avx2,fma"))) void tile_avx2(const float* x, int64_t ldx, const float* const* wr, int64_t K,
                                                    float* y, int64_t ldy, float mul) {
  __m256 acc[R][C];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) {
    __m256 xv[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) xv[r] = _mm256_loadu_ps(x + r * ldx + k);
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) {
      const __m256 wv = _mm256_loadu_ps(wr[c] + k);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) acc[r][c] = _mm256_fmadd_ps(xv[r], wv, acc[r][c]);
    }
  }
  if (k < K) {
    alignas(32) int32_t m[8];
    for (int j = 0; j < 8; ++j) m[j] = k + j < K ? -1 : 0;
    const __m256i mask = _mm256_load_si256(reinterpret_cast<const __m256i*>(m));
    __m256 xv[R];
    for (int r = 0; r < R; ++r) xv[r] = _mm256_maskload_ps(x + r * ldx + k, mask);
    for (int c = 0; c < C; ++c) {
      const __m256 wv = _mm256_maskload_ps(wr[c] + k, mask);
      for (int r = 0; r < R; ++r) acc[r][c] = _mm256_fmadd_ps(xv[r], wv, acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) y[r * ldy + c] = lane_sum_avx(acc[r][c]) * mul;
}

using TileFn = void (*)(const float*, int64_t, const float* const*, int64_t, float*, int64_t, float);

// tiles[R][C] for R ≤ 3, C ≤ 8 (only the shapes the driver uses are filled).
struct TileTable {
  TileFn t[4][9] = {};
};

template <int R, int C>
struct AvxTile {
  static constexpr TileFn fn = &tile_avx2<R, C>;
};
template <int R, int C>
struct ScalarTile {
  static constexpr TileFn fn = &tile_scalar<R, C>;
};

template <template <int, int> class T>
TileTable make_table() {
  TileTable tt;
  tt.t[1][1] = T<1, 1>::fn, tt.t[1][2] = T<1, 2>::fn, tt.t[1][3] = T<1, 3>::fn, tt.t[1][4] = T<1, 4>::fn;
  tt.t[1][5] = T<1, 5>::fn, tt.t[1][6] = T<1, 6>::fn, tt.t[1][7] = T<1, 7>::fn, tt.t[1][8] = T<1, 8>::fn;
  tt.t[2][1] = T<2, 1>::fn, tt.t[2][2] = T<2, 2>::fn, tt.t[2][3] = T<2, 3>::fn, tt.t[2][4] = T<2, 4>::fn;
  tt.t[3][1] = T<3, 1>::fn, tt.t[3][2] = T<3, 2>::fn, tt.t[3][3] = T<3, 3>::fn, tt.t[3][4] = T<3, 4>::fn;
  return tt;
}

const TileTable& tiles() {
  static const TileTable tt = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")
                                  ? make_table<AvxTile>()
                                  : make_table<ScalarTile>();
  return tt;
}

// y[i0:i1, n0:n1] for weight rows given as pointers wr[0 : n1-n0] (fp32, K each).
void gemm_block(const float* x, int64_t ldx, int64_t i0, int64_t i1, const float* const* wr, int64_t nb,
                int64_t K, float* y, int64_t ldy, float mul) {
  const TileTable& tt = tiles();
  if (i1 - i0 == 1) {  // decode: 8 independent chains per tile
    for (int64_t c = 0; c < nb; c += 8) {
      const int cc = int(std::min<int64_t>(8, nb - c));
      tt.t[1][cc](x + i0 * ldx, ldx, wr + c, K, y + i0 * ldy + c, ldy, mul);
    }
    return;
  }
  for (int64_t c = 0; c < nb; c += 4) {
    const int cc = int(std::min<int64_t>(4, nb - c));
    for (int64_t i = i0; i < i1; i += 3) {
      const int rr = int(std::min<int64_t>(3, i1 - i));
      tt.t[rr][cc](x + i * ldx, ldx, wr + c, K, y + i * ldy + c, ldy, mul);
    }
  }
}

// Per-thread expansion panel, grown only when a larger K is first seen
// (linear_cpu_reserve sizes it up front so a model step allocates nothing).
std::vector<float>& thread_panel() {
  thread_local std::vector<float> panel;
  return panel;
}
std::vector<float>& thread_xq() {
  thread_local std::vector<float> xq;
  return xq;
}

}  // namespace

void linear_cpu_reserve(int64_t max_k, int64_t max_m) {
#pragma omp parallel
  {
    std::vector<float>& p = thread_panel();
    if (int64_t(p.size()) < kBlockRows * max_k) p.resize(size_t(kBlockRows * max_k));
  }
  std::vector<float>& xq = thread_xq();
  if (int64_t(xq.size()) < max_m * max_k) xq.resize(size_t(max_m * max_k));
}

void gemm_f32_rows(const float* x, int64_t ldx, int64_t m, const float* const* w_rows, int64_t n, int64_t k, float* y,
                   int64_t ldy) {
  for (int64_t n0 = 0; n0 < n; n0 += kBlockRows)
    gemm_block(x, ldx, 0, m, w_rows + n0, std::min(kBlockRows, n - n0), k, y + n0, ldy, 1.0f);
}

void gemm_f32(const float* x, int64_t m, const float* w, int64_t n, int64_t k, float* y) {
  const int64_t n_blocks = (n + kBlockRows - 1) / kBlockRows;
  const bool par = n * k * m >= (int64_t(1) << 16);
#pragma omp parallel for schedule(static) if (par)
  for (int64_t t = 0; t < n_blocks * m; ++t) {
    const int64_t b = t / m, i = t % m;
    const float* wr[kBlockRows];
    const int64_t nb = std::min(kBlockRows, n - b * kBlockRows);
    for (int64_t r = 0; r < nb; ++r) wr[r] = w + (b * kBlockRows + r) * k;
    gemm_block(x, k, i, i + 1, wr, nb, k, y + b * kBlockRows, n, 1.0f);
  }
}

void linear_cpu(const LinearWeight& w, const float* x, int64_t m, float* y, ActQuant aq) {
  linear_cpu_rows(w, 0, w.out_features, x, w.in_features, m, y, w.out_features, aq);
}

void linear_cpu_rows(const LinearWeight& w, int64_t row0, int64_t N, const float* x, int64_t m, float* y,
                     ActQuant aq) {
  linear_cpu_rows(w, row0, N, x, w.in_features, m, y, N, aq);
}

void linear_cpu_rows(const LinearWeight& w, int64_t row0, int64_t N, const float* x, int64_t ldx, int64_t m, float* y,
                     int64_t ldy, ActQuant aq) {
  const int64_t K = w.in_features;
  CM_CHECK(row0 >= 0 && N >= 0 && row0 + N <= w.out_features, "linear '{}': rows [{}, {}) outside [0, {})", w.name,
           row0, row0 + N, w.out_features);
  CM_CHECK(ldx >= K && ldy >= N, "linear '{}': strides {}/{} below K {} / N {}", w.name, ldx, ldy, K, N);
  if (m <= 0 || N <= 0) return;
  // Weight-only formats ignore the activation mode (there is no W4A4 kernel for them).
  const bool w4a4 = aq == ActQuant::NVFP4 && w.format == WeightFormat::NVFP4;
  float out_mul = 1.0f;
  if (w4a4) {
    std::vector<float>& xq = thread_xq();
    if (int64_t(xq.size()) < m * K) xq.resize(size_t(m * K));
    nvfp4_quantized_activations(w, x, ldx, m, xq.data());
    x = xq.data();
    ldx = K;
    out_mul = w.input_scale * w.scale_2;
  }
  // F32 rows are used in place when 4-byte aligned (safetensors does not promise it).
  const bool f32_direct = w.format == WeightFormat::F32 && reinterpret_cast<uintptr_t>(w.data) % 4 == 0;
  const int64_t n_blocks = (N + kBlockRows - 1) / kBlockRows;
  const int threads = omp_get_max_threads();
  // Split M too when there are too few weight blocks to keep every thread busy
  // (each task expands its weight block once; chunks of >= 24 rows amortise that).
  int64_t m_chunks = 1;
  if (n_blocks < 4 * threads && m >= 48)
    m_chunks = std::min<int64_t>((m + 23) / 24, (4 * threads + n_blocks - 1) / n_blocks);
  const int64_t m_step = (m + m_chunks - 1) / m_chunks;
  const int64_t tasks = n_blocks * m_chunks;
  // Threads only pay off above ~64k multiply-adds; below, fork/join dominates.
  const bool par = N * K * m >= (int64_t(1) << 16) && tasks > 1;
#pragma omp parallel for schedule(static) if (par)
  for (int64_t t = 0; t < tasks; ++t) {
    const int64_t b = t / m_chunks, mc = t % m_chunks;
    const int64_t n0 = b * kBlockRows, nb = std::min(kBlockRows, N - n0);
    const int64_t i0 = mc * m_step, i1 = std::min(m, i0 + m_step);
    if (i0 >= i1) continue;
    const float* wr[kBlockRows];
    if (f32_direct) {
      for (int64_t r = 0; r < nb; ++r) wr[r] = reinterpret_cast<const float*>(w.data + size_t((row0 + n0 + r) * K) * 4);
    } else {
      std::vector<float>& panel = thread_panel();
      if (int64_t(panel.size()) < kBlockRows * K) panel.resize(size_t(kBlockRows * K));
      for (int64_t r = 0; r < nb; ++r) {
        float* dst = panel.data() + r * K;
        if (w4a4) expand_nvfp4_row(w, row0 + n0 + r, 1.0f, dst);
        else linear_expand_row(w, row0 + n0 + r, dst);
        wr[r] = dst;
      }
    }
    gemm_block(x, ldx, i0, i1, wr, nb, K, y + n0, ldy, out_mul);
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
