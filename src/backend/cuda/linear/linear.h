// The linear family on Hopper: y[M, N] = x[M, K] · Wᵀ for every weight format the model stores,
// with BF16 activations into the tensor cores and FP32 accumulation. One header for the family:
//  - DevLinear / run_linear: a model linear on the device in its stored format and the one call
//    the step makes (the kernel is chosen by format and M, always with batch-invariant bits);
//  - NVFP4 / MXFP4 (DeviceLinear, linear_nvfp4 …) and FP8 128×128 blocks (DeviceFp8Linear,
//    linear_fp8 …): the decode, prefill, wgmma and dequant + cuBLAS kernels;
//  - BF16 / F32 weights: the batch-invariant dense kernels (dense_linear).
// The kernels' own headers (sm90_*.cuh, linear_host.cuh, the packers) are private to the family.
//
// NVFP4 linear layers: weights uploaded in their stored size
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
//
// FP8 128x128-block linear layers on Hopper (DeepSeek's release format for
// the attention and shared-expert projections, spec 9.2): the E4M3 weight is
// uploaded in its stored size (repacked, fp8_pack.h) and
// y[M, N] = x[M, K] * W^T with BF16 activations, FP32 accumulation and BF16 or
// FP32 output, through the same structure as the NVFP4 kernels:
//  - M <= decode_max_m: tensor-core decode kernel (mma.sync with in-register
//    E4M3 -> BF16 expansion, the block scale applied in FP32 per 64-k chunk,
//    split-K with the deterministic last-arriver reduction);
//  - larger M, Fp8Prefill::Exact (the engine's choice): the prefill kernel
//    (sm90_fp8_prefill.cu: 64-token tiles, each weight chunk read and
//    expanded once per tile), which gives every row the decode kernel's bits;
//  - larger M, Fp8Prefill::Fast, power-of-two scales (always for E8M0 in
//    range): the weight is expanded to exact BF16 panels and multiplied by
//    cuBLAS (another summation order: not batch invariant);
//  - larger M, Fp8Prefill::Fast, other F32 scales (e4m3 * scale not exact in
//    bf16): the decode kernel over 32-token slices, exact but slower. Never a
//    silent precision loss.
// Grouped linears (V4's wo_a) are the same call with groups = G.
#pragma once
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>

#include "backend/cuda/core/cuda_util.h"
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

// From this many rows the mma.sync prefill path (PrefillKernel::MmaTiles, the model's) runs the exact
// wgmma kernel instead, for the weights it takes (exact_wgmma_nvfp4_unsupported): the same bits.
// Measured on an H100 (docs/performance.md): 1.7-2.6x the mma.sync tiles at 129 rows on every
// V4-Flash shape, 2x at 4096.
inline constexpr int64_t kNvfp4ExactWgmmaMinRows = 128;

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
// With ctx, MmaTiles names the exact wgmma kernel where linear_nvfp4 would run it.
const char* linear_nvfp4_path(const DeviceLinear& w, int64_t M, int64_t decode_max_m = 64,
                              PrefillKernel prefill = PrefillKernel::Auto, Context* ctx = nullptr);

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

// The wgmma kernel with the decode kernel's bits (sm90_nvfp4_exact_wgmma.cu): tiles of 128 weight rows
// x 64 tokens, weights as wgmma's register operand in the decode kernel's fragments, activations
// reordered by a pass into the decode kernel's k positions, four accumulators per output (one per
// decode warp) summed per split in the decode kernel's order. Why it does not take a weight (nullptr:
// it does): K % 16 != 0, grouped weights whose groups are not a multiple of 128 rows.
const char* exact_wgmma_nvfp4_unsupported(Context& ctx, const DeviceLinear& w, int64_t M);
void linear_nvfp4_exact_wgmma(Context& ctx, const DeviceLinear& w, const uint16_t* x, int64_t M, int64_t ldx, void* y,
                              int64_t ldy, OutType out);

// Expands W to bf16 [N, K] row-major, values exact (includes scale_2 only if apply_scale_2).
void dequant_nvfp4_bf16(Context& ctx, const DeviceLinear& w, int64_t row0, int64_t rows, uint16_t* out,
                        bool apply_scale_2);

// ---- FP8 128×128-block linears ----
struct DeviceFp8Linear {
  std::string name;
  int64_t N = 0, K = 0;
  int64_t row_blocks = 0, chunks = 0;
  int64_t scale_rows = 0, scale_cols = 0;
  int groups = 1;            // x has groups*K columns; rows [g*N/groups, (g+1)*N/groups) read slice g
  bool pow2_scales = false;  // prefill may expand to bf16 exactly
  DeviceBuffer data;         // packed E4M3 (fp8_pack.h)
  DeviceBuffer scales;       // f32 [scale_rows, scale_cols]
  size_t device_bytes() const { return data.size() + scales.size(); }
};

// The kernel path names linear_fp8 returns (also the bench's `path`).
inline constexpr const char* kFp8PathDecode = "fp8 mma.sync decode";
inline constexpr const char* kFp8PathCublas = "fp8 dequant+cuBLAS";
inline constexpr const char* kFp8PathSlices = "fp8 mma.sync 32-token slices (non-pow2 F32 scales)";
inline constexpr const char* kFp8PathPrefill = "fp8 mma.sync prefill (decode bits)";
inline constexpr const char* kFp8PathExactWgmma = "fp8 wgmma prefill (decode bits)";

// How linear_fp8 serves M > decode_max_m (see the top of the file).
enum class Fp8Prefill : uint8_t { Fast, Exact };

// The smallest M the engine runs through the prefill kernel (device_model.cu);
// below it the decode kernel (same bits either way: a speed choice only).
// At 128 rows the prefill kernel reads each weight chunk twice (two 64-token
// tiles) where the decode kernel reads it four times (four 32-token slices);
// below that its (M/64) x (N/64) work items of 64 x 64 outputs leave most SMs
// idle (q_a at M = 128: 32 items for 132 SMs).
inline constexpr int64_t kFp8PrefillMinM = 128;

// Repacks on the host and uploads. groups > 1 needs N divisible by 16*groups.
// Throws cm::Error naming the tensor for bad shapes and NaN/Inf/zero scales.
DeviceFp8Linear upload_fp8(const LinearWeight& w, int groups = 1);

// y[m * ldy + n] for m < M, n < N. x: bf16 [M, ldx] (ldx >= groups*K), device
// pointers. Returns the path that ran (one of kFp8Path*).
const char* linear_fp8(Context& ctx, const DeviceFp8Linear& w, const uint16_t* x, int64_t M, int64_t ldx, void* y,
                       int64_t ldy, OutType out, int64_t decode_max_m = 64, Fp8Prefill prefill = Fp8Prefill::Fast);

// Two decode linears of one input (ungrouped, the same K; q_a and kv at decode) in one launch, each
// output with the bits linear_fp8 gives it at this M: when M <= 32 and both split K (fewer than 8
// row blocks per SM) and their split-K workspaces fit the Context's side by side. Returns false, having
// launched nothing, otherwise (the caller runs the two linears).
bool linear_fp8_pair(Context& ctx, const DeviceFp8Linear& wa, const DeviceFp8Linear& wb, const uint16_t* x, int64_t M,
                     int64_t ldx, void* ya, int64_t ldya, void* yb, int64_t ldyb, OutType out);

// The prefill kernel alone (any M >= 1): what linear_fp8 runs with Fp8Prefill::Exact above decode_max_m.
void linear_fp8_prefill(Context& ctx, const DeviceFp8Linear& w, const uint16_t* x, int64_t M, int64_t ldx, void* y,
                        int64_t ldy, OutType out);

// The wgmma kernel with the decode kernel's bits (sm90_fp8_exact_wgmma.cu; as the NVFP4 one): what
// Fp8Prefill::Exact runs from kFp8ExactWgmmaMinRows rows for the weights it takes (nullptr: it takes
// w; else why not: K % 16 != 0, more than 512 scale columns, groups not a multiple of 128 rows).
inline constexpr int64_t kFp8ExactWgmmaMinRows = 128;
const char* exact_wgmma_fp8_unsupported(Context& ctx, const DeviceFp8Linear& w, int64_t M);
void linear_fp8_exact_wgmma(Context& ctx, const DeviceFp8Linear& w, const uint16_t* x, int64_t M, int64_t ldx, void* y,
                            int64_t ldy, OutType out);

// The K split the decode kernel uses for w at every M (the prefill kernel
// reproduces it): chunks of 64 k per split; ceil(w.chunks / it) splits.
int64_t fp8_chunks_per_split(Context& ctx, const DeviceFp8Linear& w);

// Expands rows [row0, row0+rows) (row0 % 16 == 0) to bf16 [rows, K] row-major,
// e4m3 * scale exactly. Only for pow2_scales weights (throws otherwise).
void dequant_fp8_bf16(Context& ctx, const DeviceFp8Linear& w, int64_t row0, int64_t rows, uint16_t* out);

// ---- BF16 / F32 weights: the dense kernels ----

// y[m, n] = alpha · Σ_k x[m, g·K + k] · W[n, k], g = n / (N / groups). W f32 or bf16 [N, K]; x f32
// or bf16; y f32 or bf16. Each output depends only on its own row of x, so a row gets the same bits
// in any batch (cuBLAS picks kernels by M and would not). BF16 weights run on tensor cores
// (dense_linear_mma) when dense_mma_supported — a property of the shapes and buffers, never of M;
// the others (F32 weights, odd K) take a SIMT kernel: per output, lanes over k in a fixed order,
// then a fixed shuffle tree.
void dense_linear(Context& ctx, const void* w, bool w_bf16, int64_t N, int64_t K, int groups, const void* x,
                  bool x_bf16, int64_t M, int64_t ldx, void* y, bool y_bf16, int64_t ldy, float alpha);

// The tensor-core path of dense_linear for BF16 weights (dense_mma.cu): x split exactly into three
// bf16 parts (one for bf16 x), fp32 accumulation, K cut into chunks fixed by the weight shape and
// split over 8 warps, added in a fixed order.
bool dense_mma_supported(int64_t K, int64_t ldx, const void* x, bool x_bf16);
void dense_linear_mma(Context& ctx, const uint16_t* w, int64_t N, int64_t K, int groups, const void* x, bool x_bf16,
                      int64_t M, int64_t ldx, void* y, bool y_bf16, int64_t ldy, float alpha);

// ---- A model linear in any format ----

// One linear on the device. Exactly one of the three storages is used.
struct DevLinear {
  std::string name;
  WeightFormat format = WeightFormat::F32;
  int64_t N = 0, K = 0;  // K per group
  int groups = 1;
  DeviceBuffer dense;                  // F32 / BF16 [N, K] as stored
  std::unique_ptr<DeviceLinear> fp4;   // NVFP4 / MXFP4
  std::unique_ptr<DeviceFp8Linear> fp8;
  bool empty() const { return N == 0; }
  bool wants_bf16_input() const { return fp4 || fp8; }
  size_t bytes() const;
};

// Uploads a checkpoint linear in its stored format (F16 is expanded to F32, exactly: there is no
// F16 kernel). groups > 1: the grouped output projection (N divisible by groups).
DevLinear upload_linear(const LinearWeight& w, int groups = 1);

// y[M, N] = x · Wᵀ. x is f32 or bf16 (x_bf16) with rows ldx apart; the FP4/FP8
// kernels take bf16, so f32 x is cast into cast_scratch (>= M·groups·K bf16) first.
// Every path computes a row independently of the other rows, with one kernel
// whatever M (the decode kernels; FP8 from kFp8PrefillMinM rows the prefill
// kernel, which gives the same bits; see cuda_backend.cu on batch invariance).
// batch_invariant false (BackendOptions): FP8/NVFP4 weights at more than kGraphMaxRows rows run as
// BF16 panels through cuBLAS (Context panel scratch of fast_prefill_panel_bytes), not batch-invariant.
void run_linear(Context& ctx, const DevLinear& w, const void* x, bool x_bf16, int64_t M, int64_t ldx, void* y,
                bool y_bf16, int64_t ldy, uint16_t* cast_scratch, bool batch_invariant = true);

// Steps of up to this many rows run as CUDA graphs (cuda_backend.cu) and always through the
// batch-invariant kernels.
inline constexpr int64_t kGraphMaxRows = 256;

// Two linears of the same bf16 rows x [M, K] (ldx = K) into f32 y_a, y_b (rows N apart), in one launch
// when both are FP8 or both NVFP4/MXFP4 decode linears that pair (linear_fp8_pair, linear_nvfp4_pair),
// with the bits run_linear gives each. False, having launched nothing, otherwise.
bool run_linear_pair(Context& ctx, const DevLinear& a, const DevLinear& b, const uint16_t* x, int64_t M, float* y_a,
                     float* y_b);

}  // namespace cm::cuda
