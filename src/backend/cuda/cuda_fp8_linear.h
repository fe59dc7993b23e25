// FP8 128x128-block linear layers on Hopper (DeepSeek's release format for
// the attention and shared-expert projections, spec 9.2): the E4M3 weight is
// uploaded in its stored size (repacked, fp8_pack.h) and
// y[M, N] = x[M, K] * W^T with BF16 activations, FP32 accumulation and BF16 or
// FP32 output, through the same structure as the NVFP4 kernels
// (cuda_linear.h):
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
#include <cstdint>
#include <string>

#include "backend/cuda/cuda_linear.h"
#include "backend/cuda/cuda_util.h"
#include "ops/linear.h"

namespace cm::cuda {

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

// The K split the decode kernel uses for w at every M (the prefill kernel
// reproduces it): chunks of 64 k per split; ceil(w.chunks / it) splits.
int64_t fp8_chunks_per_split(Context& ctx, const DeviceFp8Linear& w);

// Expands rows [row0, row0+rows) (row0 % 16 == 0) to bf16 [rows, K] row-major,
// e4m3 * scale exactly. Only for pow2_scales weights (throws otherwise).
void dequant_fp8_bf16(Context& ctx, const DeviceFp8Linear& w, int64_t row0, int64_t rows, uint16_t* out);

}  // namespace cm::cuda
