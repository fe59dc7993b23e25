// Host-side pieces shared by the weight-format linears (NVFP4/MXFP4, FP8):
// the token slicing and split-K choice of the decode kernels and the prefill
// through exact BF16 weight panels and cuBLAS.
#pragma once
#include <cublas_v2.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "backend/cuda/linear/linear.h"
#include "backend/cuda/core/cuda_util.h"

namespace cm::cuda {

// Shape limits common to every uploaded linear: grouped weights split N into
// groups of whole 16-row blocks, and the kernels index with 32-bit N and K.
inline void check_upload_shape(const char* name, int64_t N, int64_t K, int groups) {
  CM_CU_CHECK(groups == 1 || (groups > 1 && N % (int64_t(16) * groups) == 0),
              "linear '%s': %d groups need N (%lld) divisible by 16*groups", name, groups, (long long)N);
  CM_CU_CHECK(N < (int64_t(1) << 31) && K < (int64_t(1) << 31), "linear '%s': shape too large", name);
}

// The decode kernels take at most 32 tokens per launch (MT = 1, 2 or 4
// groups of 8): launch(std::integral_constant<int, MT>, x_slice, tokens, y_slice)
// runs once per 32-token slice of x / y.
template <typename Launch>
void decode_in_slices(const uint16_t* x, int64_t M, int64_t ldx, void* y, int64_t ldy, OutType out, Launch&& launch) {
  const size_t esize = out == OutType::BF16 ? 2 : 4;
  for (int64_t m0 = 0; m0 < M; m0 += 32) {
    const int64_t mm = std::min<int64_t>(32, M - m0);
    const uint16_t* xs = x + m0 * ldx;
    void* ys = static_cast<char*>(y) + size_t(m0 * ldy) * esize;
    if (mm <= 8)
      launch(std::integral_constant<int, 1>{}, xs, mm, ys);
    else if (mm <= 16)
      launch(std::integral_constant<int, 2>{}, xs, mm, ys);
    else
      launch(std::integral_constant<int, 4>{}, xs, mm, ys);
  }
}

// Two decode linears of one input in one launch (linear_fp8_pair, linear_nvfp4_pair; q_a and kv at
// decode): for at most 32 rows, ungrouped, the same K, both on the split-K path (fewer than 8 row
// blocks per SM, as the single launch decides), so each CTA runs what it would in its own launch.
// Checks the arguments and calls launch(std::integral_constant<int, MT>) -> bool (false: nothing
// launched); false when the two do not pair.
template <class W, class Launch>
bool decode_pair(Context& ctx, const W& wa, const W& wb, const uint16_t* x, int64_t M, int64_t ldx, int64_t ldya,
                 int64_t ldyb, Launch&& launch) {
  const int64_t most = int64_t(ctx.sm_count()) * 8;
  if (M <= 0 || M > 32 || wa.K != wb.K || wa.groups != 1 || wb.groups != 1 || wa.row_blocks >= most ||
      wb.row_blocks >= most)
    return false;
  CM_CU_CHECK(ldx >= wa.K && ldya >= wa.N && ldyb >= wb.N, "linears '%s' + '%s': leading dimensions too small",
              wa.name.c_str(), wb.name.c_str());
  CM_CU_CHECK((ldx % 8) == 0 && (reinterpret_cast<uintptr_t>(x) % 16) == 0,
              "linears '%s' + '%s': activations must be 16-byte aligned rows", wa.name.c_str(), wb.name.c_str());
  if (M <= 8) return launch(std::integral_constant<int, 1>{});
  if (M <= 16) return launch(std::integral_constant<int, 2>{});
  return launch(std::integral_constant<int, 4>{});
}

// The pair's split-K workspace: each linear its own partials (128·MT floats per row block and split)
// and counters, side by side in the Context's. P: a decode kernel's parameters (row_blocks, ksplit,
// partials, counters). False, setting nothing, when the two do not fit (the caller launches them apart).
template <class P>
bool decode_pair_workspace(Context& ctx, P& a, P& b, int mt) {
  const int64_t fa = a.ksplit > 1 ? int64_t(a.ksplit) * a.row_blocks * 128 * mt : 0;
  const int64_t fb = b.ksplit > 1 ? int64_t(b.ksplit) * b.row_blocks * 128 * mt : 0;
  const int64_t ca = a.ksplit > 1 ? a.row_blocks : 0, cb = b.ksplit > 1 ? b.row_blocks : 0;
  if (size_t(fa + fb) > ctx.workspace().splitk_floats || size_t(ca + cb) > ctx.workspace().splitk_counters)
    return false;
  float* part = ctx.splitk_partials(size_t(fa + fb));
  unsigned* cnt = ctx.splitk_counters(size_t(ca + cb));
  if (a.ksplit > 1) a.partials = part, a.counters = cnt;
  if (b.ksplit > 1) b.partials = part + fa, b.counters = cnt + ca;
  return true;
}

// K split of a decode launch over row_blocks CTAs of `chunks` 64-k chunks:
// about one wave of CTAs (sm_count * occupancy) while keeping at least 2
// chunks per warp (8 per CTA) so the pipelined loads overlap the math.
struct SplitK {
  int64_t ksplit = 1, per = 1;  // splits, chunks per split
};
inline SplitK choose_splitk(int sm_count, int occupancy, int64_t row_blocks, int64_t chunks) {
  const int64_t target = int64_t(sm_count) * std::max(occupancy, 1);
  int64_t ksplit = std::clamp<int64_t>(target / row_blocks, 1, std::max<int64_t>(1, chunks / 8));
  const int64_t per = (chunks + ksplit - 1) / ksplit;
  return SplitK{(chunks + per - 1) / per, per};
}

// The K split of a weight's decode launches (and of the NVFP4 prefill kernel,
// which must reproduce it). It is one split per weight and device, whatever
// the launch's MT: a row's sum depends on the split points, and a token must
// get the same bits alone, in a slice of 9 or of 32 rows. The MT variants'
// occupancies differ (the NVFP4 kernels' registers give 3, 4 and 2 CTAs per
// SM on the H200), so every MT uses occupancy[0], the one-token kernel's
// (its one-wave split is the one measured for decode). Many row blocks (wq_b,
// the head): one CTA per row block, no split.
inline SplitK decode_split(int sm_count, const int (&occupancy)[3], int64_t row_blocks, int64_t chunks) {
  if (row_blocks >= int64_t(sm_count) * 8) return SplitK{1, chunks};
  return choose_splitk(sm_count, occupancy[0], row_blocks, chunks);
}

// y = alpha * x * W^T through cuBLAS BF16 GEMMs (FP32 compute) on weight
// panels that dequant(row0, rows, panel) expands to exact bf16 [rows, K].
// Grouped weights (groups > 1) are expanded whole and run as one strided
// batch; others in panels of at most 256 MB.
template <typename Dequant>
void prefill_bf16_panels(Context& ctx, const char* name, int64_t N, int64_t K, int groups, const uint16_t* x, int64_t M,
                         int64_t ldx, void* y, int64_t ldy, OutType out, float alpha, Dequant&& dequant) {
  CM_CU_CHECK(K % 8 == 0, "linear '%s': K must be a multiple of 8 for the cuBLAS path", name);
  auto h = static_cast<cublasHandle_t>(ctx.cublas());
  const float beta = 0.f;
  const cudaDataType_t ct = out == OutType::BF16 ? CUDA_R_16BF : CUDA_R_32F;
  const size_t esize = out == OutType::BF16 ? 2 : 4;
  if (groups > 1) {
    const int64_t ng = N / groups;
    uint16_t* panel = static_cast<uint16_t*>(ctx.panel_scratch(prefill_panel_bytes(N, K, groups)));
    dequant(int64_t(0), N, panel);
    check_cublas(cublasGemmStridedBatchedEx(h, CUBLAS_OP_T, CUBLAS_OP_N, int(ng), int(M), int(K), &alpha, panel,
                                            CUDA_R_16BF, int(K), ng * K, x, CUDA_R_16BF, int(ldx), K, &beta, y, ct,
                                            int(ldy), ng, groups, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 "cublasGemmStridedBatchedEx");
    return;
  }
  const int64_t panel_rows = int64_t(prefill_panel_bytes(N, K, 1) / size_t(2 * K));
  uint16_t* panel = static_cast<uint16_t*>(ctx.panel_scratch(prefill_panel_bytes(N, K, 1)));
  for (int64_t r0 = 0; r0 < N; r0 += panel_rows) {
    const int64_t rows = std::min(panel_rows, N - r0);
    dequant(r0, rows, panel);
    void* yp = static_cast<char*>(y) + size_t(r0) * esize;
    check_cublas(
        cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, int(rows), int(M), int(K), &alpha, panel, CUDA_R_16BF, int(K), x,
                     CUDA_R_16BF, int(ldx), &beta, yp, ct, int(ldy), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
        "cublasGemmEx");
  }
}

}  // namespace cm::cuda
