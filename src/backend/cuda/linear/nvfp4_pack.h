// Host-side repacking of an NVFP4 LinearWeight into the layout the Hopper
// kernels read (same byte count as the checkpoint: 4 bits per weight plus one
// byte per 16). Plain C++ so it also builds and is testable without CUDA.
//
// Layout (see sm90_nvfp4.cuh for the matching decode):
//  - rows are grouped in row blocks of 16, K in chunks of 64 (zero padded);
//  - data: per (row block, chunk) 512 bytes = 32 lanes x 16 bytes. Lane
//    (g = lane/4, t = lane%4) holds rows g and g+8 at k = 64c+16t .. +15, as
//    four 32-bit words (one per mma.sync k16 step j: k = 64c+16t+4j .. +3),
//    bits arranged so each bf16x2 mma operand is one shift and one mask away;
//  - scales: per (row block, chunk) 64 bytes; at g*8 + t*2 the scale byte of
//    (row g, block 4c+t), then of (row g+8, same block), re-encoded as an
//    unsigned 5-bit exponent / 3-bit mantissa byte so the kernel turns it into
//    a bf16 with one multiply-add. Zero-scale blocks get zero codes; negative
//    scales flip the codes' signs; NaN scales are rejected.
#pragma once
#include <cstdint>
#include <vector>

#include "ops/linear.h"

namespace cm::cuda {

struct Nvfp4Packed {
  int64_t N = 0, K = 0;
  int64_t row_blocks = 0, chunks = 0;  // ceil(N/16), ceil(K/64)
  float scale_2 = 1.0f;
  std::vector<uint8_t> data;    // row_blocks * chunks * 512
  std::vector<uint8_t> scales;  // row_blocks * chunks * 64
};

// Repacks an NVFP4 weight (throws cm::Error for other formats, odd K, NaN
// scales). An MXFP4 weight is forwarded to pack_mxfp4, so every caller (the
// linear and MoE uploads) takes both FP4 formats.
Nvfp4Packed pack_nvfp4(const LinearWeight& w);

// MXFP4 (E2M1 + one E8M0 scale per 32 k, spec 9.3) into the same layout and
// kernels: each E8M0 scale becomes the scale byte of its two 16-blocks, and
// scale_2 is the power of two that puts the tensor's largest exponent at the
// top of the byte's kScaleWindow binades, so every block is exact. Throws
// cm::Error naming the tensor when the exponents span more binades than that,
// for the E8M0 NaN code 0xFF, K not divisible by 32, or a bad scale shape.
Nvfp4Packed pack_mxfp4(const LinearWeight& w);

// Inverse view used by tests: the fp32 value of W[n, k] as the kernel sees it
// (code x scale x scale_2), read back from the packed bytes.
float packed_nvfp4_value(const Nvfp4Packed& p, int64_t n, int64_t k);

// Constants shared with the kernels.
inline constexpr int kPackChunkK = 64;
inline constexpr int kPackRows = 16;
// bf16 scale = byte*16 + kScaleBias*128 equals scale * 2^kScaleShift; the raw
// E2M1 bf16 is value * 2^-126, so mma products carry 2^(kScaleShift-126).
// The packed scale byte is an unsigned E5M3 with exponent bias kScaleExpBias:
// it spans the kScaleWindow binades 2^-9 .. 2^22 (E4M3 scales use 2^-9 .. 2^8).
inline constexpr int kScaleExpBias = 9;
inline constexpr int kScaleWindow = 32;
inline constexpr int kScaleShift = 100;
inline constexpr int kScaleBias = 127 - kScaleExpBias + kScaleShift;
inline constexpr float kEpilogueFactor = 67108864.0f;  // 2^(126 - kScaleShift) = 2^26

}  // namespace cm::cuda
