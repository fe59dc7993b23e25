// NVFP4 linear on wgmma with the decode kernel's bits (linear.h, linear_nvfp4_exact_wgmma).
//
// Why: the model needs a row's bits not to depend on the batch, and the decode kernel fixes them:
// within each K split, warp kw of a 16-row block sums the chunks kw, kw + 4, ... in order (four
// m16n8k16 steps per 64-k chunk, in the packed layout's lane-private k order), the four warp sums
// meet as (w0 + w1) + (w2 + w3), and the splits as 0 + v0 + v1 + ... (one split: v0 alone). The
// mma.sync prefill kernel (sm90_nvfp4_prefill.cu) reproduces that at ~150-200 TFLOP/s; this one runs
// the same sums on wgmma.
//
// How the order is kept:
//  - The weights are wgmma's A operand, from registers: warp w4 of a consumer warpgroup expands its
//    16-row block of each chunk with the decode kernel's own code (expand_word), so its registers
//    hold exactly the decode kernel's A fragments — wgmma's register A layout per warp is mma.sync's.
//  - The activations are the B operand, from shared memory, at the logical k positions the decode
//    kernel gives them: reordered by a pass into scratch (sm90_exact_wgmma.cuh), streamed by bulk copies.
//  - Each CTA walks the whole K of its tile, split by split as the decode kernel splits it, with four
//    accumulators per output (one per decode warp: chunk c of split s goes to (c - s·per) mod 4), sums
//    them in registers in the decode order at the end of the split and adds the split into a running
//    total (0 + v0 + v1 ...). No cluster, no second pass.
//  - That one wgmma k16 step rounds exactly as one mma.sync k16 step on the same operands is a property
//    of the hardware, checked on the device (tests/gpu/test_tensor_core_numerics.cu); the op table
//    compares this kernel with the decode kernel bit for bit.
//
// CTA = 3 warpgroups over a tile of 128 weight rows x 64 tokens: warpgroup 0 produces (one thread: the
// bulk copy of the x tile and one tensor copy each of the 8 packed row blocks' codes and scales per
// chunk, S stages on full/empty mbarriers), warpgroups 1 and 2 consume rows 0-63 and 64-127
// (m64n64k16, 4 x 32 accumulators and a 32-float total per thread). A warpgroup expands chunk c + 1
// while chunk c's four wgmmas run.
#include <cuda.h>

#include <algorithm>

#include "backend/cuda/core/kernel_setup.h"
#include "backend/cuda/linear/linear.h"
#include "backend/cuda/linear/linear_host.cuh"
#include "backend/cuda/linear/sm90_mbarrier.cuh"
#include "backend/cuda/linear/sm90_exact_wgmma.cuh"
#include "backend/cuda/linear/sm90_nvfp4.cuh"
#include "backend/cuda/linear/sm90_tma.cuh"
#include "backend/cuda/linear/sm90_wgmma.cuh"

namespace cm::cuda {

namespace {

using namespace sm90;
using exact_wgmma::kToks;
using exact_wgmma::kXTile;

constexpr int kRows = 128;            // weight rows per tile (2 consumer warpgroups x 64)
constexpr int kRB = kRows / 16;       // packed row blocks per tile
constexpr int kStages = 8;
constexpr int kWStage = kRB * 512;    // packed codes
constexpr int kSStage = kRB * 64;     // packed scales
constexpr int kXOff = 0;
constexpr int kWOff = kXOff + kStages * kXTile;
constexpr int kSOff = kWOff + kStages * kWStage;
constexpr int kBarOff = kSOff + kStages * kSStage;
constexpr int kBytes = kBarOff + 2 * kStages * 8;
constexpr int kSmem = kBytes + 1024;  // room to align the base to 1024
static_assert(kXTile % 1024 == 0, "swizzled tiles: 1024-byte aligned");
static_assert(kSmem <= 227 * 1024, "shared memory per block");

struct ExactParams {
  const uint8_t* w;   // packed codes (nvfp4_pack.h)
  const uint8_t* s;   // packed scales
  const uint8_t* xp;  // reordered activation tiles [token tile][group chunk][kXTile bytes]
  void* y;
  int64_t ldy;
  int chunks, N, row_blocks, rbg, M;  // rbg: row blocks per group (all when ungrouped); M: this slab's tokens
  int gchunks;                        // chunks of all groups (x tiles per token tile)
  int ksplit, per;                    // the decode kernel's split of this weight
  int y_bf16;
  float out_scale;
};

// This warp's A fragments of a staged chunk: the decode kernel's chunk_mma operands for row block rb.
__device__ __forceinline__ void expand_chunk(const uint8_t* wst, const uint8_t* sst, int rb, int lane,
                                             uint32_t (&a)[4][4]) {
  const uint4 wv = *reinterpret_cast<const uint4*>(wst + rb * 512 + lane * 16);
  const uint32_t sv = *reinterpret_cast<const uint16_t*>(sst + rb * 64 + lane * 2);
  uint32_t sg, sg8;
  decode_scales(sv, sg, sg8);
  expand_word(wv.x, sg, sg8, a[0]);
  expand_word(wv.y, sg, sg8, a[1]);
  expand_word(wv.z, sg, sg8, a[2]);
  expand_word(wv.w, sg, sg8, a[3]);
}

__global__ void __launch_bounds__(384, 1) nvfp4_exact_wgmma_kernel(const __grid_constant__ CUtensorMap wmap,
                                                                   const __grid_constant__ CUtensorMap smap,
                                                                   const ExactParams p) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = exact_wgmma::align_1024(smem_raw);
  const uint32_t sbase = smem_u32(smem);
  const uint32_t full0 = sbase + kBarOff, empty0 = full0 + kStages * 8;
  const int rb0 = blockIdx.x * kRB, tt = blockIdx.y;
  const int grp = rb0 / p.rbg;  // a tile never straddles groups (host check)
  const int nrb = min(kRB, p.row_blocks - rb0);
  const int wg = threadIdx.x / 128, lane = threadIdx.x & 31;

  if (threadIdx.x == 0) exact_wgmma::init_ring(full0, empty0, kStages);
  __syncthreads();
  // The reordered activations come from the previous kernel (programmatic dependent launch).
  asm volatile("griddepcontrol.wait;" ::: "memory");

  if (wg == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
    if (threadIdx.x == 0) {
      asm volatile("prefetch.tensormap [%0];" ::"l"(&wmap) : "memory");
      asm volatile("prefetch.tensormap [%0];" ::"l"(&smap) : "memory");
      // Three copies per chunk: the x tile, and the 8 row blocks' codes and scales as one box each (row
      // blocks past the matrix arrive as zeros and are never stored).
      constexpr uint32_t tx = kXTile + kWStage + kSStage;
      const uint8_t* xt = p.xp + (int64_t(tt) * p.gchunks + int64_t(grp) * p.chunks) * kXTile;
      exact_wgmma::produce(p.chunks, kStages, full0, empty0, tx, sbase + kXOff, xt, [&](int c, int st, uint32_t full) {
        tma_load_2d(sbase + kWOff + st * kWStage, &wmap, c * 128, rb0, full);
        tma_load_2d(sbase + kSOff + st * kSStage, &smap, c * 16, rb0, full);
      });
    }
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
  const int cw = wg - 1, w4 = (threadIdx.x >> 5) & 3, g = lane >> 2, t = lane & 3;
  const int rb = 4 * cw + w4;  // this warp's row block in the tile
  const bool present = rb < nrb;
  float acc[4][32], tot[32];
  uint32_t af[2][4][4] = {};  // A fragments of two chunks (absent row blocks: zeros)
  for (int s = 0; s < p.ksplit; ++s) {
    const int cb = s * p.per, ce = min(p.chunks, cb + p.per);
#pragma unroll
    for (int kw = 0; kw < 4; ++kw)
#pragma unroll
      for (int i = 0; i < 32; ++i) acc[kw][i] = 0.f;
    // Chunk c's wgmmas stay in flight while chunk c + 1 is expanded (A buffers alternate with c within a
    // split) and issued; waiting for all but the newest group then retires chunk c and frees its stage.
    int prev_st = -1;
    for (int c0 = cb; c0 < ce; c0 += 4) {
#pragma unroll
      for (int kw = 0; kw < 4; ++kw) {
        const int c = c0 + kw;
        if (c >= ce) break;
        const int st = c % kStages;
        mbar_wait(full0 + 8 * st, uint32_t(c / kStages) & 1u);
        uint32_t(&a)[4][4] = af[kw & 1];
        if (present) expand_chunk(smem + kWOff + st * kWStage, smem + kSOff + st * kSStage, rb, lane, a);
        const uint64_t db = desc_sw128(sbase + kXOff + st * kXTile);
        wgmma_fence();
#pragma unroll
        for (int j = 0; j < 4; ++j) WgmmaRS<kToks>::mma(acc[kw], a[j], db + uint64_t(2 * j), 1);
        wgmma_commit();
        wgmma_wait<1>();
        if (prev_st >= 0 && lane == 0) mbar_arrive(empty0 + 8 * prev_st);
        prev_st = st;
      }
    }
    wgmma_wait<0>();
#pragma unroll
    for (int kw = 0; kw < 4; ++kw) fence_regs(acc[kw]);
    if (prev_st >= 0 && lane == 0) mbar_arrive(empty0 + 8 * prev_st);
#pragma unroll
    for (int i = 0; i < 32; ++i) tot[i] = exact_wgmma::add_split(tot[i], exact_wgmma::chains_sum(acc, i), s, p.ksplit);
  }
  if (!present) return;
  exact_wgmma::store_fragment(tot, tt * kToks, (rb0 + rb) * 16 + g, t, p.M, p.N, p.y, p.ldy, p.y_bf16 != 0,
                              p.out_scale);
}

}  // namespace

void setup_nvfp4_exact_wgmma_kernels() {
  CM_CUDA(cudaFuncSetAttribute(nvfp4_exact_wgmma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
}

const char* exact_wgmma_nvfp4_unsupported(Context& ctx, const DeviceLinear& w, int64_t M) {
  if (M <= 0 || M >= (int64_t(1) << 31)) return "M out of range";
  if (w.K % 16 != 0) return "K is not a multiple of 16";
  if (w.groups > 1 && (w.N / w.groups) % kRows != 0) return "grouped weights need groups of a multiple of 128 rows";
  if (!exact_wgmma::fits_scratch(ctx, w.chunks, w.groups))
    return "the reordered activations of one 64-token tile do not fit the scratch";
  return nullptr;
}

void linear_nvfp4_exact_wgmma(Context& ctx, const DeviceLinear& w, const uint16_t* x, int64_t M, int64_t ldx, void* y,
                              int64_t ldy, OutType out) {
  const char* why = exact_wgmma_nvfp4_unsupported(ctx, w, M);
  CM_CU_CHECK(why == nullptr, "linear '%s': the exact wgmma kernel does not take it: %s", w.name.c_str(),
              why ? why : "");
  CM_CU_CHECK(ldx >= w.groups * w.K && ldy >= w.N, "linear '%s': leading dimensions too small", w.name.c_str());
  const SplitK sk = decode_split(ctx.sm_count(), ctx.setup().nvfp4_decode_occupancy, w.row_blocks, w.chunks);
  ExactParams p{};
  p.w = w.data.as<const uint8_t>();
  p.s = w.scales.as<const uint8_t>();
  p.ldy = ldy;
  p.chunks = int(w.chunks);
  p.gchunks = int(w.groups * w.chunks);
  p.N = int(w.N);
  p.row_blocks = int(w.row_blocks);
  p.rbg = int(w.groups > 1 ? w.N / w.groups / 16 : w.row_blocks);
  p.ksplit = int(sk.ksplit);
  p.per = int(sk.per);
  p.y_bf16 = out == OutType::BF16;
  p.out_scale = kEpilogueFactor * w.scale_2;
  const size_t es = out == OutType::BF16 ? 2 : 4;
  // Codes [row_blocks][chunks x 512 bytes] and scales [row_blocks][chunks x 64 bytes] as u32 rows.
  const CUtensorMap wmap = encode_tensor_map_2d(CU_TENSOR_MAP_DATA_TYPE_UINT32, w.data.get(), uint64_t(w.chunks) * 128,
                                                uint64_t(w.row_blocks), uint64_t(w.chunks) * 512, 128, kRB,
                                                CU_TENSOR_MAP_SWIZZLE_NONE, w.name.c_str());
  const CUtensorMap smap = encode_tensor_map_2d(CU_TENSOR_MAP_DATA_TYPE_UINT32, w.scales.get(), uint64_t(w.chunks) * 16,
                                                uint64_t(w.row_blocks), uint64_t(w.chunks) * 64, 16, kRB,
                                                CU_TENSOR_MAP_SWIZZLE_NONE, w.name.c_str());
  exact_wgmma::for_each_slab(ctx, x, ldx, M, int(w.K), w.chunks, w.groups, [&](int64_t m0, int64_t mm, const uint8_t* xp) {
    p.xp = xp;
    p.M = int(mm);
    p.y = static_cast<uint8_t*>(y) + size_t(m0) * size_t(ldy) * es;
    launch_kernel(ctx, nvfp4_exact_wgmma_kernel, dim3(unsigned((w.row_blocks + kRB - 1) / kRB), unsigned((mm + kToks - 1) / kToks)),
                  dim3(384), kSmem, "nvfp4_exact_wgmma_kernel", wmap, smap, p);
  });
}

}  // namespace cm::cuda
