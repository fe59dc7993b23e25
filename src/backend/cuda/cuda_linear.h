// NVFP4 linear layers on Hopper: weights uploaded in their stored size
// (repacked, nvfp4_pack.h) and y[M, N] = x[M, K] * W^T with BF16 activations,
// FP32 accumulation and BF16 or FP32 output.
//  - M <= 64: tensor-core decode kernel (mma.sync, in-register E2M1 expansion,
//    split-K across CTAs with an in-kernel last-arriver reduction);
//  - M > 64: the wgmma kernel (sm90_nvfp4_wgmma.cu: TMA + mbarrier pipeline,
//    the weight expanded in registers as wgmma's A operand), or, for shapes it
//    does not take, the weight expanded to BF16 panels and multiplied by cuBLAS;
//  - the model (run_linear) needs a row's bits not to depend on the batch, so
//    it runs the decode kernel below kNvfp4TilesMinRows rows and from there
//    the mma.sync prefill kernel (sm90_nvfp4_prefill.cu), which reproduces the
//    decode kernel's sums bit for bit in tiles of 64 rows.
// Grouped linears (V4's wo_a: G independent [N/G, K] blocks, each applied to
// its own K-slice of x) are the same call with groups = G.
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>

#include "backend/cuda/cuda_util.h"
#include "ops/linear.h"

namespace cm::cuda {

enum class OutType : uint8_t { F32, BF16 };

// Which kernel serves M > decode_max_m. Auto: the one measured faster for the
// shape (wgmma for large weights up to M = 256, else dequant + cuBLAS; see
// sm90_nvfp4_linear.cu). Asking for Wgmma on a shape it does not take throws.
// MmaTiles: the mma.sync prefill kernel (sm90_nvfp4_prefill.cu), bit for bit
// the decode kernel's output for every row (the model's batch invariance).
enum class PrefillKernel : uint8_t { Auto, Wgmma, DequantCublas, MmaTiles };

// Bytes of Context panel scratch the dequant + cuBLAS path needs for one weight of N rows (all
// groups) and K columns per group: the whole weight when grouped (one strided-batched GEMM), else
// panels of up to 256 MiB (whole 16-row multiples).
inline size_t prefill_panel_bytes(int64_t N, int64_t K, int groups) {
  if (groups > 1) return size_t(N * K) * 2;
  const int64_t rows = std::min<int64_t>(std::max<int64_t>(16, ((int64_t(256) << 20) / (2 * K)) / 16 * 16),
                                         (N + 15) / 16 * 16);
  return size_t(rows * K) * 2;
}

// From this many rows the model's linears (run_linear) take the mma.sync
// prefill kernel instead of 32-row slices of the decode kernel (same bits).
inline constexpr int64_t kNvfp4TilesMinRows = 128;

struct DeviceLinear {
  std::string name;
  int64_t N = 0, K = 0;
  int64_t row_blocks = 0, chunks = 0;
  int groups = 1;  // x has groups*K columns; rows [g*N/groups, (g+1)*N/groups) read slice g
  float scale_2 = 1.0f;
  DeviceBuffer data, scales;
  size_t device_bytes() const { return data.size() + scales.size(); }
};

// Repacks on the host and uploads. groups > 1 needs N divisible by 16*groups.
DeviceLinear upload_nvfp4(const LinearWeight& w, int groups = 1);

// Random but valid NVFP4 weight generated on the device (benchmarks).
DeviceLinear random_nvfp4(int64_t N, int64_t K, uint64_t seed, int groups = 1);

// Fills packed buffers with random codes and valid encoded scales (benchmarks).
void fill_random_packed(void* data, size_t data_bytes, void* scales, size_t scale_bytes, uint64_t seed);

// y[m * ldy + n] for m < M, n < N. x: bf16 [M, ldx] (ldx >= groups*K), device pointers.
// decode_max_m: largest M served by the decode kernel (else dequant + cuBLAS).
void linear_nvfp4(Context& ctx, const DeviceLinear& w, const uint16_t* x, int64_t M, int64_t ldx, void* y,
                  int64_t ldy, OutType out, int64_t decode_max_m = 64, PrefillKernel prefill = PrefillKernel::Auto);

// Two decode linears of one input (ungrouped, the same K; q_a and kv at decode) in one launch, each
// output with the bits linear_nvfp4 gives it at this M: when M <= 32, both split K (fewer than 8 row
// blocks per SM) and their split-K workspaces fit the Context's side by side. Returns false, having
// launched nothing, otherwise (the caller runs the two linears).
bool linear_nvfp4_pair(Context& ctx, const DeviceLinear& wa, const DeviceLinear& wb, const uint16_t* x, int64_t M,
                       int64_t ldx, void* ya, int64_t ldya, void* yb, int64_t ldyb, OutType out);

// The kernel linear_nvfp4 runs for these arguments ("mma.sync decode", "wgmma", "dequant+cuBLAS",
// "mma.sync prefill").
const char* linear_nvfp4_path(const DeviceLinear& w, int64_t M, int64_t decode_max_m = 64,
                              PrefillKernel prefill = PrefillKernel::Auto);

// The wgmma prefill kernel alone: any M >= 1; grouped weights need N/groups % 128 == 0 and K % 64 == 0.
bool wgmma_nvfp4_supported(const DeviceLinear& w, int64_t M);
void linear_nvfp4_wgmma(Context& ctx, const DeviceLinear& w, const uint16_t* x, int64_t M, int64_t ldx, void* y,
                        int64_t ldy, OutType out);

// The mma.sync prefill kernel alone (any M >= 1, any shape the decode kernel
// takes): tiles of 64 rows x 128 weight rows, each weight chunk expanded once
// per tile; every output has the bits of the decode kernel (same K split,
// per-warp chunk walk, warp and split reduction order and epilogue).
void linear_nvfp4_tiles(Context& ctx, const DeviceLinear& w, const uint16_t* x, int64_t M, int64_t ldx, void* y,
                        int64_t ldy, OutType out);

// Expands W to bf16 [N, K] row-major, values exact (includes scale_2 only if apply_scale_2).
void dequant_nvfp4_bf16(Context& ctx, const DeviceLinear& w, int64_t row0, int64_t rows, uint16_t* out,
                        bool apply_scale_2);

}  // namespace cm::cuda
