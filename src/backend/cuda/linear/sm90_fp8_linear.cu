// FP8 128x128-block linear kernels for Hopper (see linear.h).
//
// Decode kernel: sm90_decode.cuh's, shared with NVFP4, with FP8 chunks (Fp8Format
// below): each warp expands E4M3 to BF16 in registers, multiplies with mma.sync
// and applies each chunk's block scale in FP32.
#include <algorithm>

#include "backend/cuda/linear/linear.h"
#include "backend/cuda/linear/fp8_pack.h"
#include "backend/cuda/core/kernel_setup.h"
#include "backend/cuda/linear/linear_host.cuh"
#include "backend/cuda/linear/sm90_decode.cuh"
#include "backend/cuda/linear/sm90_fp8.cuh"

namespace cm::cuda {

namespace {

struct Fp8DecodeParams : Fp8Args {
  int ksplit;
  int chunks_per_split;
  float* partials;
  unsigned* counters;
};

// How the FP8 decode kernel (sm90_decode.cuh) reads a K chunk: two 16-byte words of E4M3 codes per lane
// (1024 bytes a 16-row chunk) and the f32 block scale of its 128x128 block, expanded by fp8_chunk_mma
// (sm90_fp8.cuh). FP8 chunks hold twice the weight registers of NVFP4 ones, and the pipelined loop keeps
// two batches live: fewer chunks per batch.
struct Fp8Format {
  using Params = Fp8DecodeParams;
  template <int MT, bool PIPE>
  static constexpr int kUnroll = MT == 1 ? 4 : (MT == 2 || !PIPE ? 2 : 1);
  static constexpr const char* kName = "fp8_decode_kernel";
  static constexpr const char* kPairName = "fp8_decode_pair_kernel";
  struct Block {
    const uint4* wb;
    const float* sb;
  };
  static __device__ __forceinline__ void prefetch(const Params& p, int64_t u0, int64_t n) {
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p.w + u0 * 64), "r"(uint32_t(n * 1024)) : "memory");
  }
  static __device__ __forceinline__ Block block(const Params& p, int rb, int lane, int g, int t) {
    return Block{p.w + int64_t(rb) * p.chunks * 64 + lane, p.s + int64_t(rb / 8) * p.scale_cols};
  }
  template <int MT, int U, bool PIPE>
  static __device__ __forceinline__ void kloop(const Block& b, const __nv_bfloat16* const (&xrow)[MT],
                                               const bool (&xok)[MT], int64_t c_first, int64_t c_end, int64_t cstep,
                                               int64_t K, int t, float (&acc)[MT][4]) {
    sm90::fp8_warp_kloop<MT, U, PIPE>(b.wb, b.sb, xrow, xok, c_first, c_end, cstep, K, t, acc);
  }
  static constexpr bool kScaledOutput = false;  // the sums as they are
  static const int (&occupancy(Context& ctx))[3] { return ctx.setup().fp8_decode_occupancy; }
};

Fp8DecodeParams decode_params(const DeviceFp8Linear& w, const uint16_t* x, int64_t M, int64_t ldx, void* y,
                              int64_t ldy, OutType out) {
  Fp8DecodeParams p{};
  static_cast<Fp8Args&>(p) = fp8_args(w, x, M, ldx, y, ldy, out);
  return p;
}

// Expands rows of row blocks [rb0, rb0+row_blocks) to bf16 [rows, K] at
// out - row0*K: one warp per (row block, chunk). Exact for pow2 scales in
// [kFp8Pow2Min, kFp8Pow2Max] (checked at upload).
__global__ void fp8_dequant_kernel(const uint4* w, const float* s, int64_t chunks, int scale_cols, int N, int K,
                                   int64_t rb0, int64_t row_blocks, int64_t row0, __nv_bfloat16* out) {
  using namespace sm90;
  const int64_t unit = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (unit >= row_blocks * chunks) return;
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int64_t rb = rb0 + unit / chunks, c = unit % chunks;
  const int64_t k = c * 64 + 16 * t;
  if (k >= K) return;
  const __nv_bfloat162 s2 = __float2bfloat162_rn(s[(rb / 8) * scale_cols + c / 2]);
  const uint32_t sc = *reinterpret_cast<const uint32_t*>(&s2);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t n = rb * 16 + g + 8 * h;
    const uint4 wv = w[(rb * chunks + c) * 64 + 32 * h + lane];
    const uint32_t ws[4] = {wv.x, wv.y, wv.z, wv.w};
    uint32_t r[8];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      r[2 * j] = bf16x2_mul(fp8x2_lo(ws[j]), sc);
      r[2 * j + 1] = bf16x2_mul(fp8x2_hi(ws[j]), sc);
    }
    if (n < N) {
      uint4* o = reinterpret_cast<uint4*>(out + (n - row0) * int64_t(K) + k);
      o[0] = make_uint4(r[0], r[1], r[2], r[3]);
      o[1] = make_uint4(r[4], r[5], r[6], r[7]);
    }
  }
}

// The decode kernel's K split, the same at every MT (and so at every M): a
// row's bits then never depend on the size of the slice it ran in, and the
// prefill kernel reproduces them (sm90_fp8_prefill.cu). decode_split
// (linear_host.cuh) gives every MT the one-token kernel's split, as for NVFP4.
SplitK fp8_decode_split(Context& ctx, const DeviceFp8Linear& w) {
  return decode_split(ctx.sm_count(), Fp8Format::occupancy(ctx), w.row_blocks, w.chunks);
}

// The decode kernel over 32-token slices (MT = 1, 2 or 4 by slice size).
void decode_slices(Context& ctx, const DeviceFp8Linear& w, const uint16_t* x, int64_t M, int64_t ldx, void* y,
                   int64_t ldy, OutType out) {
  decode_in_slices(x, M, ldx, y, ldy, out, [&](auto mt, const uint16_t* xs, int64_t mm, void* ys) {
    launch_decode<Fp8Format, decltype(mt)::value>(ctx, decode_params(w, xs, mm, ldx, ys, ldy, out));
  });
}

}  // namespace

// The occupancies size the split-K scratch (cuda_util.cu); the split itself
// takes the one-token kernel's for every MT (fp8_decode_split).
void setup_fp8_decode_kernels(KernelSetup& s) {
  decode_occupancy<Fp8Format>(s.fp8_decode_occupancy);
  setup_fp8_prefill_kernels();
}

int64_t fp8_chunks_per_split(Context& ctx, const DeviceFp8Linear& w) { return fp8_decode_split(ctx, w).per; }

DeviceFp8Linear upload_fp8(const LinearWeight& w, int groups) {
  Fp8Packed p = pack_fp8(w);
  check_upload_shape(w.name.c_str(), p.N, p.K, groups);
  DeviceFp8Linear d;
  d.name = w.name;
  d.N = p.N;
  d.K = p.K;
  d.row_blocks = p.row_blocks;
  d.chunks = p.chunks;
  d.scale_rows = p.scale_rows;
  d.scale_cols = p.scale_cols;
  d.groups = groups;
  d.pow2_scales = p.pow2_scales;
  d.data.alloc(p.data.size());
  d.data.upload(p.data.data(), p.data.size());
  d.scales.alloc(p.scales.size() * 4);
  d.scales.upload(p.scales.data(), p.scales.size() * 4);
  return d;
}

void dequant_fp8_bf16(Context& ctx, const DeviceFp8Linear& w, int64_t row0, int64_t rows, uint16_t* out) {
  CM_CU_CHECK(w.pow2_scales, "linear '%s': FP8 scales are not all powers of two; bf16 expansion would round",
              w.name.c_str());
  CM_CU_CHECK(row0 % 16 == 0 && row0 >= 0 && rows > 0 && row0 + rows <= w.N, "dequant_fp8_bf16: bad row range");
  const int64_t rb0 = row0 / 16, nrb = (rows + 15) / 16;
  const int64_t units = nrb * w.chunks;
  fp8_dequant_kernel<<<unsigned((units + 7) / 8), 256, 0, ctx.stream()>>>(
      w.data.as<const uint4>(), w.scales.as<const float>(), w.chunks, int(w.scale_cols),
      int(std::min(w.N, row0 + rows)), int(w.K), rb0, nrb, row0, reinterpret_cast<__nv_bfloat16*>(out));
  CM_CUDA_LAUNCH("fp8_dequant_kernel");
}

bool linear_fp8_pair(Context& ctx, const DeviceFp8Linear& wa, const DeviceFp8Linear& wb, const uint16_t* x, int64_t M,
                     int64_t ldx, void* ya, int64_t ldya, void* yb, int64_t ldyb, OutType out) {
  return decode_pair(ctx, wa, wb, x, M, ldx, ldya, ldyb, [&](auto mt) {
    return launch_decode_pair<Fp8Format, decltype(mt)::value>(ctx, decode_params(wa, x, M, ldx, ya, ldya, out),
                                                              decode_params(wb, x, M, ldx, yb, ldyb, out));
  });
}

const char* linear_fp8(Context& ctx, const DeviceFp8Linear& w, const uint16_t* x, int64_t M, int64_t ldx, void* y,
                       int64_t ldy, OutType out, int64_t decode_max_m, Fp8Prefill prefill) {
  CM_CU_CHECK(ldx >= w.groups * w.K && ldy >= w.N, "linear '%s': leading dimensions too small", w.name.c_str());
  CM_CU_CHECK((ldx % 8) == 0 && (reinterpret_cast<uintptr_t>(x) % 16) == 0,
              "linear '%s': activations must be 16-byte aligned rows", w.name.c_str());
  if (M <= decode_max_m) {
    if (M > 0) decode_slices(ctx, w, x, M, ldx, y, ldy, out);
    return kFp8PathDecode;
  }
  if (prefill == Fp8Prefill::Exact) {  // the decode kernel's bits either way
    if (M >= kFp8ExactWgmmaMinRows && exact_wgmma_fp8_unsupported(ctx, w, M) == nullptr) {
      linear_fp8_exact_wgmma(ctx, w, x, M, ldx, y, ldy, out);
      return kFp8PathExactWgmma;
    }
    linear_fp8_prefill(ctx, w, x, M, ldx, y, ldy, out);
    return kFp8PathPrefill;
  }
  if (w.pow2_scales) {
    prefill_bf16_panels(
        ctx, w.name.c_str(), w.N, w.K, w.groups, x, M, ldx, y, ldy, out, 1.0f,
        [&](int64_t row0, int64_t rows, uint16_t* panel) { dequant_fp8_bf16(ctx, w, row0, rows, panel); });
    return kFp8PathCublas;
  }
  decode_slices(ctx, w, x, M, ldx, y, ldy, out);
  return kFp8PathSlices;
}

}  // namespace cm::cuda
