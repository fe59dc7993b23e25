// NVFP4 linear on wgmma with the decode kernel's bits (linear.h, linear_nvfp4_exact_wgmma).
//
// Why: the model needs a row's bits not to depend on the batch, and the decode kernel fixes them:
// within each K split, warp kw of a 16-row block sums the chunks kw, kw + 4, ... in order (four
// m16n8k16 steps per 64-k chunk, in the packed layout's lane-private k order), the four warp sums
// meet as (w0 + w1) + (w2 + w3), and the splits as 0 + v0 + v1 + ... . The mma.sync prefill kernel
// (sm90_nvfp4_prefill.cu) reproduces that at ~100-200 TFLOP/s; this one runs the same sums on wgmma.
//
// How the order is kept:
//  - Four accumulators per output (one per kw) do not fit a useful tile in one CTA's registers, so
//    each (split, kw) chain runs in its own CTA of a cluster of 4 x ksplit CTAs, all on the same
//    output tile (128 tokens x 256 weight rows); at the end each CTA leaves its tile of sums in
//    shared memory and CTA r of the cluster reduces tokens [r·128/C, (r+1)·128/C) of all of them,
//    through distributed shared memory, in the decode kernel's order, then scales and stores.
//  - The activations are wgmma's A operand, from registers: lane (g, t) of a warp holds tokens g and
//    g + 8 of its 16, and for k16 step j the pairs at k = 16t + 4j + {0,1} and 16t + 4j + {2,3} —
//    exactly the B fragment of the decode kernel's step j (the mma.sync operands swap roles, the
//    products and their logical k positions stay). They are read from the TMA's 128B-swizzled tile.
//  - The weights are wgmma's B operand from shared memory: each chunk's packed row blocks are
//    expanded (expand_word, exact BF16 value·scale·2^-26) into a K-major 128B-swizzled tile whose
//    column 16j + L holds logical position L of step j, as the decode kernel's A fragment has it.
//  - That one wgmma k16 step rounds exactly as one mma.sync k16 step on the same operands is a
//    property of the hardware, checked on the device (tests/gpu/test_tensor_core_numerics.cu); the
//    op table compares this kernel with the decode kernel bit for bit.
//
// CTA = 3 warpgroups: warpgroup 0 produces (the TMA of the x tile [128 tokens x 64 k] and 1-D bulk
// copies of the 16 packed row blocks and their scales per stage, S stages on full/empty mbarriers),
// warpgroups 1 and 2 consume (tokens 0-63 and 64-127, m64n256k16 each, 128 accumulators per
// thread); both expand half of each chunk's weights into one of two B buffers while the previous
// chunk's wgmmas run, and one barrier per chunk orders that against both warpgroups' wgmmas.
#include <cuda.h>

#include <algorithm>

#include "backend/cuda/core/kernel_setup.h"
#include "backend/cuda/linear/linear.h"
#include "backend/cuda/linear/linear_host.cuh"
#include "backend/cuda/linear/sm90_mbarrier.cuh"
#include "backend/cuda/linear/sm90_nvfp4.cuh"
#include "backend/cuda/linear/sm90_tma.cuh"
#include "backend/cuda/linear/sm90_wgmma.cuh"

namespace cm::cuda {

namespace {

using namespace sm90;

constexpr int kRows = 256;                 // weight rows per tile
constexpr int kRB = kRows / 16;            // packed row blocks per tile
constexpr int kToks = 128;                 // tokens per tile (2 consumer warpgroups x 64)
constexpr int kStages = 5;
constexpr int kXStage = kToks * 128;       // bf16 [128 tokens][64 k], 128B-swizzled
constexpr int kWStage = kRB * 512;         // packed codes
constexpr int kSStage = kRB * 64;          // packed scales
constexpr int kBTile = kRows * 128;        // expanded bf16 [256 rows][64 logical k], 128B-swizzled
constexpr int kBBufs = 2;
constexpr int kXOff = 0;
constexpr int kBOff = kXOff + kStages * kXStage;
constexpr int kWOff = kBOff + kBBufs * kBTile;
constexpr int kSOff = kWOff + kStages * kWStage;
constexpr int kBarOff = kSOff + kStages * kSStage;
constexpr int kBytes = kBarOff + 2 * kStages * 8;
constexpr int kSmem = kBytes + 1024;       // room to align the base to 1024
constexpr int kPitch = kRows + 8;          // floats per token row of the sums tile (+8: fewer conflicts)
constexpr int kMaxCluster = 16;            // 4 x ksplit CTAs: ksplit <= 4 (beyond 8: a non-portable size)
static_assert(kToks * kPitch * 4 <= kBarOff, "the sums tile must fit in the idle pipeline buffers");
static_assert(kBOff % 1024 == 0 && kXStage % 1024 == 0 && kBTile % 1024 == 0, "swizzled tiles: 1024-byte aligned");
static_assert(kSmem <= 227 * 1024, "shared memory per block");

struct ExactParams {
  const uint8_t* w;  // packed codes (nvfp4_pack.h)
  const uint8_t* s;  // packed scales
  void* y;
  int64_t ldy;
  int chunks, N, row_blocks, rbg, K, M;  // rbg: row blocks per group (all when ungrouped)
  int ksplit, per;                       // the decode kernel's split of this weight
  int y_bf16, y_vec;
  float out_scale;
};

// Expands row block rb (16 rows) of a staged chunk into the B tile: lane (g, t)'s word j gives
// rows g and g + 8 at logical positions 2t, 2t+1 (a[0], a[1]) and 2t+8, 2t+9 (a[2], a[3]) of step j.
__device__ __forceinline__ void expand_block(const uint8_t* wst, const uint8_t* sst, uint8_t* btile, int rb, int lane) {
  const int g = lane >> 2, t = lane & 3;
  const uint4 wv = *reinterpret_cast<const uint4*>(wst + rb * 512 + lane * 16);
  const uint32_t sv = *reinterpret_cast<const uint16_t*>(sst + rb * 64 + lane * 2);
  uint32_t sg, sg8;
  decode_scales(sv, sg, sg8);
  const uint32_t ws[4] = {wv.x, wv.y, wv.z, wv.w};
  const int r0 = rb * 16 + g;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    uint32_t a[4];
    expand_word(ws[j], sg, sg8, a);
    *reinterpret_cast<uint32_t*>(btile + sw128_offset(r0, 16 * j + 2 * t)) = a[0];
    *reinterpret_cast<uint32_t*>(btile + sw128_offset(r0 + 8, 16 * j + 2 * t)) = a[1];
    *reinterpret_cast<uint32_t*>(btile + sw128_offset(r0, 16 * j + 8 + 2 * t)) = a[2];
    *reinterpret_cast<uint32_t*>(btile + sw128_offset(r0 + 8, 16 * j + 8 + 2 * t)) = a[3];
  }
}

// This lane's A fragments of the four k16 steps of a chunk: tokens tok and tok + 8 (rows of the
// swizzled x tile), 16-byte units 2t and 2t + 1 (k = 16t .. 16t + 15); step j takes the decode
// kernel's B pairs (sm90_nvfp4.cuh chunk_mma: .x/.y for even j, .z/.w for odd, unit j / 2).
__device__ __forceinline__ void load_a(const uint8_t* xst, int tok, int t, uint32_t (&a)[4][4]) {
  uint4 q[2][2];
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int u = 0; u < 2; ++u)
      q[h][u] = *reinterpret_cast<const uint4*>(xst + sw128_offset(tok + 8 * h, 16 * t + 8 * u));
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const uint4& lo = q[0][j >> 1];
    const uint4& hi = q[1][j >> 1];
    a[j][0] = (j & 1) ? lo.z : lo.x;
    a[j][1] = (j & 1) ? hi.z : hi.x;
    a[j][2] = (j & 1) ? lo.w : lo.y;
    a[j][3] = (j & 1) ? hi.w : hi.y;
  }
}

__global__ void __launch_bounds__(384, 1) nvfp4_exact_wgmma_kernel(const __grid_constant__ CUtensorMap xmap,
                                                                   const ExactParams p) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  const uint32_t sbase = smem_u32(smem);
  const uint32_t full0 = sbase + kBarOff, empty0 = full0 + kStages * 8;
  const int csize = 4 * p.ksplit;
  const int rank = int(cluster_rank());
  const int split = rank >> 2, kw = rank & 3;
  const int rt = blockIdx.y, tt = blockIdx.z;
  const int rb0 = rt * kRB, tok0 = tt * kToks;
  const int grp = rb0 / p.rbg;                         // a tile never straddles groups (host check)
  const int nrb = min(kRB, p.row_blocks - rb0);
  const int c_begin = split * p.per, c_end = min(p.chunks, c_begin + p.per);
  const int n = (c_end - c_begin - kw + 3) / 4;        // this CTA's chunks c_begin + kw + 4i (>= 1: host check)
  const int wg = threadIdx.x / 128, lane = threadIdx.x & 31;

  if (threadIdx.x == 0) {
    for (int i = 0; i < kStages; ++i) {
      mbar_init(full0 + 8 * i, 1);
      mbar_init(empty0 + 8 * i, 8);  // one arrival per consumer warp
    }
    mbar_init_fence();
  }
  __syncthreads();

  float acc[kRows / 2];
  if (wg == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
    if (threadIdx.x < 32) {
      if (lane == 0) asm volatile("prefetch.tensormap [%0];" ::"l"(&xmap) : "memory");
      const uint32_t tx = uint32_t(kXStage + nrb * (512 + 64));
      for (int i = 0; i < n; ++i) {
        const int st = i % kStages, c = c_begin + kw + 4 * i;
        const uint32_t full = full0 + 8 * st;
        if (lane == 0) {
          mbar_wait(empty0 + 8 * st, (uint32_t(i / kStages) & 1u) ^ 1u);
          mbar_expect_tx(full, tx);
          tma_load_2d(sbase + kXOff + st * kXStage, &xmap, grp * p.K + c * 64, tok0, full);
        }
        __syncwarp();
        if (lane < nrb) {
          const int64_t unit = int64_t(rb0 + lane) * p.chunks + c;
          bulk_load(sbase + kWOff + st * kWStage + lane * 512, p.w + unit * 512, 512, full);
          bulk_load(sbase + kSOff + st * kSStage + lane * 64, p.s + unit * 64, 64, full);
        }
      }
    }
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
    const int cw = wg - 1, w4 = (threadIdx.x >> 5) & 3, g = lane >> 2, t = lane & 3;
    const int tok = 64 * cw + 16 * w4 + g;  // this lane's first token row of the tile
    const uint32_t b_u32 = sbase + kBOff;
    // Chunk i + 1 is expanded (this warp's two row blocks, into B buffer (i + 1) % 2) while chunk i's
    // wgmmas run; then wait for them, load chunk i + 1's A fragments (no wgmma may be in flight while
    // registers it reads are defined), and meet the other consumer at one barrier: both buffers'
    // expansions are complete, and the other consumer finished chunk i - 1 (the buffer just written).
    // The stage is released at the barrier: its x rows are in registers, its weights expanded.
    uint32_t a[4][4];
    auto stage_in = [&](int i) {
      const int st = i % kStages;
      mbar_wait(full0 + 8 * st, uint32_t(i / kStages) & 1u);
      uint8_t* btile = smem + kBOff + (i % kBBufs) * kBTile;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int rb = 8 * cw + 2 * w4 + h;
        if (rb < nrb) expand_block(smem + kWOff + st * kWStage, smem + kSOff + st * kSStage, btile, rb, lane);
      }
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    };
    auto ready = [&](int i) {
      const int st = i % kStages;
      load_a(smem + kXOff + st * kXStage, tok, t, a);
      named_barrier(1, 256);
      if (lane == 0) mbar_arrive(empty0 + 8 * st);
    };
    stage_in(0);
    ready(0);
    for (int i = 0; i < n; ++i) {
      const uint64_t db = desc_sw128(b_u32 + (i % kBBufs) * kBTile);
      wgmma_fence();
#pragma unroll
      for (int j = 0; j < 4; ++j) WgmmaRS<kRows>::mma(acc, a[j], db + uint64_t(2 * j), (i > 0 || j > 0) ? 1 : 0);
      wgmma_commit();
      if (i + 1 < n) stage_in(i + 1);
      wgmma_wait<0>();
      if (i + 1 < n) ready(i + 1);
    }
    fence_regs(acc);
    // Both consumers are done reading the pipeline buffers: the sums tile overwrites them.
    named_barrier(1, 256);
    float* tile = reinterpret_cast<float*>(smem);
#pragma unroll
    for (int i = 0; i < kRows / 8; ++i) {
      const int r = 8 * i + 2 * t;
      *reinterpret_cast<float2*>(tile + tok * kPitch + r) = make_float2(acc[4 * i], acc[4 * i + 1]);
      *reinterpret_cast<float2*>(tile + (tok + 8) * kPitch + r) = make_float2(acc[4 * i + 2], acc[4 * i + 3]);
    }
  }
  // All CTAs' sums are in their shared memory; CTA `rank` reduces its share of the tokens, on the
  // consumer warpgroups only (the producer's 40 registers are too few for this loop).
  cluster_sync();
  const int t_lo = rank * kToks / csize, t_hi = (rank + 1) * kToks / csize;
  const uint32_t tile_u32 = sbase;
  for (int e = int(threadIdx.x) - 128; wg > 0 && e < (t_hi - t_lo) * (kRows / 4); e += 256) {
    const int tl = t_lo + e / (kRows / 4), col = 4 * (e % (kRows / 4));
    const int m = tok0 + tl, nrow = rb0 * 16 + col;
    const uint32_t off = tile_u32 + uint32_t(tl * kPitch + col) * 4;
    float4 tot = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int s = 0; s < p.ksplit; ++s) {
      const float4 w0 = ld_cluster_f4(map_to_rank(off, 4 * s)), w1 = ld_cluster_f4(map_to_rank(off, 4 * s + 1));
      const float4 w2 = ld_cluster_f4(map_to_rank(off, 4 * s + 2)), w3 = ld_cluster_f4(map_to_rank(off, 4 * s + 3));
      const float4 v = make_float4((w0.x + w1.x) + (w2.x + w3.x), (w0.y + w1.y) + (w2.y + w3.y),
                                   (w0.z + w1.z) + (w2.z + w3.z), (w0.w + w1.w) + (w2.w + w3.w));
      if (p.ksplit == 1) {
        tot = v;
      } else {  // splitk_combine: 0.f + v0 + v1 + ...
        tot.x += v.x;
        tot.y += v.y;
        tot.z += v.z;
        tot.w += v.w;
      }
    }
    if (m >= p.M || col >= nrb * 16) continue;
    const float o[4] = {tot.x * p.out_scale, tot.y * p.out_scale, tot.z * p.out_scale, tot.w * p.out_scale};
    if (p.y_bf16) {
      __nv_bfloat16* yr = static_cast<__nv_bfloat16*>(p.y) + int64_t(m) * p.ldy;
      if (p.y_vec && nrow + 3 < p.N) {
        const __nv_bfloat162 lo = __floats2bfloat162_rn(o[0], o[1]), hi = __floats2bfloat162_rn(o[2], o[3]);
        uint2 u;
        u.x = *reinterpret_cast<const uint32_t*>(&lo);
        u.y = *reinterpret_cast<const uint32_t*>(&hi);
        *reinterpret_cast<uint2*>(yr + nrow) = u;
      } else {
        for (int j = 0; j < 4; ++j)
          if (nrow + j < p.N) yr[nrow + j] = __float2bfloat16_rn(o[j]);
      }
    } else {
      float* yr = static_cast<float*>(p.y) + int64_t(m) * p.ldy;
      if (p.y_vec && nrow + 3 < p.N) {
        *reinterpret_cast<float4*>(yr + nrow) = make_float4(o[0], o[1], o[2], o[3]);
      } else {
        for (int j = 0; j < 4; ++j)
          if (nrow + j < p.N) yr[nrow + j] = o[j];
      }
    }
  }
  // No CTA leaves while another may still read its shared memory.
  cluster_sync();
}

}  // namespace

void setup_nvfp4_exact_wgmma_kernels() {
  CM_CUDA(cudaFuncSetAttribute(nvfp4_exact_wgmma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  CM_CUDA(cudaFuncSetAttribute(nvfp4_exact_wgmma_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
}

const char* exact_wgmma_nvfp4_unsupported(Context& ctx, const DeviceLinear& w, int64_t M) {
  if (M <= 0 || M >= (int64_t(1) << 31)) return "M out of range";
  if (w.K % 16 != 0) return "K is not a multiple of 16";
  if (w.groups > 1 && ((w.N / w.groups) % kRows != 0 || w.K % 64 != 0))
    return "grouped weights need 256-row groups and K a multiple of 64";
  const SplitK sk = decode_split(ctx.sm_count(), ctx.setup().nvfp4_decode_occupancy, w.row_blocks, w.chunks);
  if (4 * sk.ksplit > kMaxCluster) return "the decode split has more than 4 parts";
  const int64_t last = w.chunks - (sk.ksplit - 1) * sk.per;
  if (std::min(sk.per, last) < 4) return "a split has fewer than 4 chunks";
  return nullptr;
}

void linear_nvfp4_exact_wgmma(Context& ctx, const DeviceLinear& w, const uint16_t* x, int64_t M, int64_t ldx, void* y,
                              int64_t ldy, OutType out) {
  const char* why = exact_wgmma_nvfp4_unsupported(ctx, w, M);
  CM_CU_CHECK(why == nullptr, "linear '%s': the exact wgmma kernel does not take it: %s", w.name.c_str(),
              why ? why : "");
  CM_CU_CHECK(ldx >= w.groups * w.K && ldy >= w.N, "linear '%s': leading dimensions too small", w.name.c_str());
  CM_CU_CHECK((ldx % 8) == 0 && (reinterpret_cast<uintptr_t>(x) % 16) == 0,
              "linear '%s': activations must be 16-byte aligned rows", w.name.c_str());
  const SplitK sk = decode_split(ctx.sm_count(), ctx.setup().nvfp4_decode_occupancy, w.row_blocks, w.chunks);
  CUtensorMap map;
  const cuuint64_t dims[2] = {cuuint64_t(w.groups * w.K), cuuint64_t(M)};
  const cuuint64_t strides[1] = {cuuint64_t(ldx) * 2};
  const cuuint32_t box[2] = {64, kToks};
  const cuuint32_t estr[2] = {1, 1};
  const CUresult r = tensor_map_encoder()(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<uint16_t*>(x), dims,
                                          strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                          CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                          CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  CM_CU_CHECK(r == CUDA_SUCCESS, "linear '%s': cuTensorMapEncodeTiled failed (%d)", w.name.c_str(), int(r));
  ExactParams p{};
  p.w = w.data.as<const uint8_t>();
  p.s = w.scales.as<const uint8_t>();
  p.y = y;
  p.ldy = ldy;
  p.chunks = int(w.chunks);
  p.N = int(w.N);
  p.row_blocks = int(w.row_blocks);
  p.rbg = int(w.groups > 1 ? w.N / w.groups / 16 : w.row_blocks);
  p.K = int(w.K);
  p.M = int(M);
  p.ksplit = int(sk.ksplit);
  p.per = int(sk.per);
  p.y_bf16 = out == OutType::BF16;
  const size_t es = out == OutType::BF16 ? 2 : 4;
  p.y_vec = (ldy % 4 == 0) && (reinterpret_cast<uintptr_t>(y) % (4 * es) == 0);
  p.out_scale = kEpilogueFactor * w.scale_2;
  const unsigned csize = unsigned(4 * sk.ksplit);
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(csize, unsigned((w.row_blocks + kRB - 1) / kRB), unsigned((M + kToks - 1) / kToks));
  cfg.blockDim = dim3(384);
  cfg.dynamicSmemBytes = kSmem;
  cfg.stream = ctx.stream();
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = csize;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  CM_CUDA(cudaLaunchKernelEx(&cfg, nvfp4_exact_wgmma_kernel, map, p));
  CM_CUDA_LAUNCH("nvfp4_exact_wgmma_kernel");
}

}  // namespace cm::cuda
