// FP8 128x128-block linear kernels for Hopper (see cuda_fp8_linear.h).
//
// Decode kernel: the NVFP4 decode structure (sm90_nvfp4_linear.cu) with FP8
// chunks. One CTA (4 warps) owns a 16-row block and a K range; each warp walks
// 64-wide chunks of that range with the 16-byte loads of several chunks in
// flight, expands E4M3 to BF16 in registers, multiplies with mma.sync and
// applies each chunk's block scale in FP32. The 4 warps reduce through shared
// memory; when K is split across CTAs the last CTA to arrive for a row block
// sums the partial tiles in a fixed order (deterministic), so a whole linear
// is one launch.
#include <algorithm>

#include "backend/cuda/linear/linear.h"
#include "backend/cuda/linear/fp8_pack.h"
#include "backend/cuda/core/kernel_setup.h"
#include "backend/cuda/linear/linear_host.cuh"
#include "backend/cuda/linear/sm90_fp8.cuh"
#include "backend/cuda/linear/sm90_splitk.cuh"

namespace cm::cuda {

namespace {

struct Fp8DecodeParams : Fp8Args {
  int ksplit;
  int chunks_per_split;
  float* partials;
  unsigned* counters;
};

constexpr int kWarps = 4;

// Chunks per batch: FP8 chunks hold twice the weight registers of NVFP4 ones,
// and the pipelined loop keeps two batches live.
template <int MT, bool PIPE>
struct Fp8Unroll {
  static constexpr int value = MT == 1 ? 4 : (MT == 2 || !PIPE ? 2 : 1);
};

// One CTA's work: row block rb, K split `split` of the linear p.
template <int MT, bool PIPE>
__device__ __forceinline__ void fp8_decode_cta(const Fp8DecodeParams& p, const int rb, const int split) {
  using namespace sm90;
  constexpr int U = Fp8Unroll<MT, PIPE>::value;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int64_t c_begin = int64_t(split) * p.chunks_per_split;
  const int64_t c_end = min(p.chunks, c_begin + p.chunks_per_split);
  const int64_t xcol = int64_t(rb * 16 / p.rows_per_group) * p.K + 16 * t;
  // As in the NVFP4 decode kernel: prefetch this CTA's weight slice into L2,
  // then wait for the previous kernel (PDL) before touching x or the workspace.
  if (threadIdx.x == 0 && c_end > c_begin) {
    const int64_t u0 = int64_t(rb) * p.chunks + c_begin, n = c_end - c_begin;
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p.w + u0 * 64), "r"(uint32_t(n * 1024)) : "memory");
  }
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;");

  const uint4* wb = p.w + int64_t(rb) * p.chunks * 64 + lane;
  const float* sb = p.s + int64_t(rb / 8) * p.scale_cols;
  const __nv_bfloat16* xrow[MT];
  bool xok[MT];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    const int tok = g + 8 * mt;
    xok[mt] = tok < p.M;
    xrow[mt] = p.x + int64_t(xok[mt] ? tok : 0) * p.ldx + xcol;
  }
  float acc[MT][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) acc[mt][0] = acc[mt][1] = acc[mt][2] = acc[mt][3] = 0.f;
  fp8_warp_kloop<MT, U, PIPE>(wb, sb, xrow, xok, c_begin + warp, c_end, kWarps, p.K, t, acc);

  __shared__ float red[kWarps * 8 * MT * 16];
  float vals[MT];
  reduce_warps<MT>(acc, red, vals);
  if (!splitk_combine<MT>(vals, p.partials, p.counters, p.ksplit, split, p.row_blocks, rb)) return;
  store_tile<MT>(vals, rb, p.M, p.N, p.y, p.ldy, p.y_bf16 != 0, 1.0f);
}

template <int MT, bool PIPE>
__global__ void __launch_bounds__(128) fp8_decode_kernel(const Fp8DecodeParams p) {
  fp8_decode_cta<MT, PIPE>(p, blockIdx.x, blockIdx.y);
}

// Two linears of one input in one launch (linear_fp8_pair): each CTA runs its linear's (row block,
// split) as fp8_decode_kernel's grid would, with that linear's own partials and counters, so every
// output has the bits of its own launch.
template <int MT>
__global__ void __launch_bounds__(128) fp8_decode_pair_kernel(const Fp8DecodeParams a, const Fp8DecodeParams b) {
  int rb, split;
  if (sm90::pair_cta(a.row_blocks, a.ksplit, b.row_blocks, rb, split))
    fp8_decode_cta<MT, true>(a, rb, split);
  else
    fp8_decode_cta<MT, true>(b, rb, split);
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
bool fp8_decode_unsplit(Context& ctx, const DeviceFp8Linear& w) {
  return w.row_blocks >= int64_t(ctx.sm_count()) * 8;
}
SplitK fp8_decode_split(Context& ctx, const DeviceFp8Linear& w) {
  return decode_split(ctx.sm_count(), ctx.setup().fp8_decode_occupancy, w.row_blocks, w.chunks);
}

template <int MT>
void launch_decode(Context& ctx, const DeviceFp8Linear& w, const uint16_t* x, int64_t M, int64_t ldx, void* y,
                   int64_t ldy, OutType out) {
  Fp8DecodeParams p{};
  static_cast<Fp8Args&>(p) = fp8_args(w, x, M, ldx, y, ldy, out);
  if (fp8_decode_unsplit(ctx, w)) {
    // Many row blocks (wq_b): one CTA per row block, no split, the plain loop.
    p.ksplit = 1;
    p.chunks_per_split = int(w.chunks);
    launch_kernel(ctx, fp8_decode_kernel<MT, false>, dim3(unsigned(w.row_blocks)), dim3(128), 0, "fp8_decode_kernel",
                  p);
    return;
  }
  const SplitK sk = fp8_decode_split(ctx, w);
  p.ksplit = int(sk.ksplit);
  p.chunks_per_split = int(sk.per);
  if (sk.ksplit > 1) {
    p.partials = ctx.splitk_partials(size_t(sk.ksplit * w.row_blocks * 128 * MT));
    p.counters = ctx.splitk_counters(size_t(w.row_blocks));
  }
  dim3 grid(unsigned(w.row_blocks), unsigned(sk.ksplit));
  launch_kernel(ctx, fp8_decode_kernel<MT, true>, grid, dim3(128), 0, "fp8_decode_kernel", p);
}

// The pair launch of one slice of at most 32 tokens; false (nothing launched) when the two split-K
// workspaces do not fit side by side.
template <int MT>
bool launch_decode_pair(Context& ctx, const DeviceFp8Linear& wa, const DeviceFp8Linear& wb, const uint16_t* x,
                        int64_t M, int64_t ldx, void* ya, int64_t ldya, void* yb, int64_t ldyb, OutType out) {
  Fp8DecodeParams p[2]{};
  const DeviceFp8Linear* w[2] = {&wa, &wb};
  void* y[2] = {ya, yb};
  const int64_t ldy[2] = {ldya, ldyb};
  for (int k = 0; k < 2; ++k) {
    static_cast<Fp8Args&>(p[k]) = fp8_args(*w[k], x, M, ldx, y[k], ldy[k], out);
    const SplitK sk = fp8_decode_split(ctx, *w[k]);
    p[k].ksplit = int(sk.ksplit);
    p[k].chunks_per_split = int(sk.per);
  }
  if (!decode_pair_workspace(ctx, p[0], p[1], MT)) return false;
  const int64_t ctas = int64_t(p[0].row_blocks) * p[0].ksplit + int64_t(p[1].row_blocks) * p[1].ksplit;
  launch_kernel(ctx, fp8_decode_pair_kernel<MT>, dim3(unsigned(ctas)), dim3(128), 0, "fp8_decode_pair_kernel", p[0],
                p[1]);
  return true;
}

// The decode kernel over 32-token slices (MT = 1, 2 or 4 by slice size).
void decode_slices(Context& ctx, const DeviceFp8Linear& w, const uint16_t* x, int64_t M, int64_t ldx, void* y,
                   int64_t ldy, OutType out) {
  decode_in_slices(x, M, ldx, y, ldy, out, [&](auto mt, const uint16_t* xs, int64_t mm, void* ys) {
    launch_decode<decltype(mt)::value>(ctx, w, xs, mm, ldx, ys, ldy, out);
  });
}

}  // namespace

// The occupancies size the split-K scratch (cuda_util.cu); the split itself
// takes the one-token kernel's for every MT (fp8_decode_split).
void setup_fp8_decode_kernels(KernelSetup& s) {
  CM_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&s.fp8_decode_occupancy[0], fp8_decode_kernel<1, true>, 128, 0));
  CM_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&s.fp8_decode_occupancy[1], fp8_decode_kernel<2, true>, 128, 0));
  CM_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&s.fp8_decode_occupancy[2], fp8_decode_kernel<4, true>, 128, 0));
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
    return launch_decode_pair<decltype(mt)::value>(ctx, wa, wb, x, M, ldx, ya, ldya, yb, ldyb, out);
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
  if (prefill == Fp8Prefill::Exact) {
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
