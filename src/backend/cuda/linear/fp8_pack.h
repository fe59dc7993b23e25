// Host-side repacking of a DeepSeek FP8 block weight (spec 9.2: E4M3 [N, K]
// with one E8M0 or F32 scale per 128x128 block) into the layout the Hopper
// FP8 kernels read (sm90_fp8.cuh). Plain C++ so it also builds and is testable
// without CUDA.
//
// Layout, in the spirit of nvfp4_pack.h (16-row blocks x 64-k chunks, zero
// padding of N to 16 and K to 64):
//  - data: per (row block, chunk) 1024 bytes = two 512-byte halves; in half h
//    lane (g = lane/4, t = lane%4) holds the 16 codes of row 16*rb + g + 8h at
//    k = 64c + 16t .. +15 in order. A lane's two 16-byte loads are then exactly
//    its mma.sync m16n8k16 A fragments of the chunk's four k16 steps: 32-bit
//    word j of half 0/1 is rows g/g+8 at k = 64c + 16t + 4j .. +3 (the same k
//    order as the NVFP4 layout, so the activations load identically);
//  - scales: f32 [ceil(N/128), ceil(K/128)] (E8M0 decoded exactly). A row
//    block and a chunk never straddle a 128 block, so one scale per chunk.
#pragma once
#include <cstdint>
#include <vector>

#include "ops/linear.h"

namespace cm::cuda {

struct Fp8Packed {
  int64_t N = 0, K = 0;
  int64_t row_blocks = 0, chunks = 0;      // ceil(N/16), ceil(K/64)
  int64_t scale_rows = 0, scale_cols = 0;  // ceil(N/128), ceil(K/128)
  // Every block scale is 2^j with j in [kFp8Pow2Min, kFp8Pow2Max]: each
  // e4m3 * scale is then exact in bf16 and the prefill may expand to bf16.
  bool pow2_scales = false;
  std::vector<uint8_t> data;  // row_blocks * chunks * 1024
  std::vector<float> scales;  // scale_rows * scale_cols
};

// Repacks an FP8_BLOCK weight. Throws cm::Error naming the tensor for other
// formats, K not divisible by 16, a scale shape other than
// [ceil(N/128), ceil(K/128)], a scale dtype other than F8_E8M0/F32, a scale
// that is NaN, Inf or zero, or an E4M3 NaN code in the weight.
Fp8Packed pack_fp8(const LinearWeight& w);

// The fp32 value of W[n, k] as the kernels see it (code x scale), read back
// from the packed bytes (tests).
float packed_fp8_value(const Fp8Packed& p, int64_t n, int64_t k);

// Powers of two 2^j for which every E4M3 value times 2^j is a bf16 (normal
// or subnormal): the smallest code 2^-9 needs j - 9 >= -133, the largest
// 448 * 2^j must stay below bf16's maximum.
inline constexpr int kFp8Pow2Min = -124;
inline constexpr int kFp8Pow2Max = 119;

// The kernels' E4M3 -> BF16 expansion, in the form both the device code and
// the host test use. v holds two codes as prmt(w, 0, sel) with sign
// replication lays them out: [b0, sign(b0) x 8, b1, sign(b1) x 8] (low byte
// first). Shifting by 4 puts each code's 7 exponent/mantissa bits at bf16 bits
// 4..10 and a replicated sign bit at bit 15 (31): the bf16 is the E4M3 value
// times 2^-120 exactly, subnormals included (E4M3 bias 7, bf16 bias 127).
inline constexpr uint32_t kFp8ToBf16Mask = 0x87F087F0u;
inline constexpr uint32_t fp8x2_to_bf16x2_raw(uint32_t v) { return (v << 4) & kFp8ToBf16Mask; }
// bf16 2^120, the exact factor that turns the raw expansion into the E4M3 value.
inline constexpr uint32_t kBf16x2Pow120 = 0x7B807B80u;
// Host model of the sign-replicating byte permute the kernel uses for codes b0, b1.
inline constexpr uint32_t fp8x2_spread(uint8_t b0, uint8_t b1) {
  return uint32_t(b0) | ((b0 & 0x80u) ? 0xFF00u : 0u) | (uint32_t(b1) << 16) | ((b1 & 0x80u) ? 0xFF000000u : 0u);
}

}  // namespace cm::cuda
