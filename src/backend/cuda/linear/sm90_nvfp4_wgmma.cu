// NVFP4 prefill GEMM on Hopper (sm_90a): y[M, N] = x[M, K] * W^T with the
// weights staying 4-bit in device memory and expanded on chip, once per tile.
//
// Why this structure: at M in the hundreds and thousands the linear is
// compute-bound, so the weights must feed wgmma (the only path to Hopper's full
// BF16 rate). Per 64-k chunk each consumer warp expands its 16-row block of the
// packed tile (nvfp4_pack.h) to BF16 in a 128-byte-swizzled shared buffer, the
// layout wgmma reads; activations arrive by TMA in the same swizzle. Both
// operands come from shared memory (SS form), so the expansion of chunk c+1
// runs while chunk c's wgmmas are in flight. (The register-A form was tried
// first: defining the next chunk's A registers while wgmmas run makes ptxas
// serialize them, C7513, and with one chunk in flight it reached ~60% of
// cuBLAS; the packed layout's lane-private k order also forced a 4-way
// gather per fragment.)
//
// CTA = 3 warpgroups: warpgroup 0 produces (one TMA of the x tile [BN tokens x
// 64 k] plus 1-D bulk copies of the 8 packed row blocks and their scales per
// stage, S stages on full/empty mbarriers), warpgroups 1 and 2 consume, each
// owning 64 weight rows x BN tokens of FP32 accumulators (setmaxnreg moves
// registers from the producer to them), with a double-buffered BF16 A tile.
//
// Exactness is the decode kernel's: E2M1 * 2^-126 times (E4M3 scale * 2^100)
// is exact in BF16; the epilogue applies 2^26 * scale_2 in FP32. The output is
// staged through shared memory so global stores are row-contiguous. Small
// grids split K across CTAs with a deterministic last-arriver reduction.
#include <cuda.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <mutex>

#include "backend/cuda/linear/linear.h"
#include "backend/cuda/core/kernel_setup.h"
#include "backend/cuda/linear/sm90_nvfp4.cuh"
#include "backend/cuda/linear/sm90_mbarrier.cuh"
#include "backend/cuda/linear/sm90_tma.cuh"
#include "backend/cuda/linear/sm90_wgmma.cuh"

namespace cm::cuda {

namespace {

using sm90::bulk_load;
using sm90::mbar_arrive;
using sm90::mbar_expect_tx;
using sm90::mbar_init;
using sm90::mbar_init_fence;
using sm90::mbar_wait;
using sm90::smem_u32;
using sm90::desc_sw128;
using sm90::fence_regs;
using sm90::named_barrier;
using sm90::tma_load_2d;
using sm90::wgmma_commit;
using sm90::wgmma_fence;
using sm90::wgmma_wait;

constexpr int kBM = 128;          // weight rows per CTA (2 consumer warpgroups x 64)
constexpr int kRowBlocks = kBM / 16;
constexpr int kWStage = kRowBlocks * 512;  // packed weight bytes per stage
constexpr int kSStage = kRowBlocks * 64;   // scale bytes per stage
constexpr int kATile = 64 * 128;            // one consumer's expanded A tile: bf16 [64 rows][64 k]
constexpr int kStagePad = 68;              // floats per staged output row (64 + 4: conflict-free)

template <int BN>
struct Tile {
  // As many stages as fit in 227 KB: a stage is released only after the next
  // chunk's wgmmas were issued and its own completed, so S - 2 stages of loads
  // are really in flight (ncu at S = 4: consumers stalled on the full barriers).
  static constexpr int kStages = BN == 256 ? 5 : BN == 128 ? 8 : 10;
  static constexpr int kXStage = BN * 128;  // bf16 [BN][64], 128B-swizzled
  static constexpr int kXOff = 0;
  static constexpr int kAOff = kXOff + kStages * kXStage;  // bf16 A [2 consumers][2 buffers][64][64]
  static constexpr int kWOff = kAOff + 4 * kATile;
  static constexpr int kSOff = kWOff + kStages * kWStage;
  static constexpr int kBarOff = kSOff + kStages * kSStage;
  static constexpr int kBytes = kBarOff + 2 * kStages * 8;
  static constexpr int kSmem = kBytes + 1024;  // room to align the base to 1024
  static_assert(2 * BN * kStagePad * 4 <= kWOff, "output staging must fit in the x and A buffers");
  static_assert(kAOff % 1024 == 0, "swizzled tiles need 1024-byte alignment");
  static_assert(kSmem <= 227 * 1024, "shared memory per block");
};

struct WgmmaParams {
  const uint8_t* w;       // packed data
  const uint8_t* s;       // packed scales
  int64_t chunks;
  int N, row_blocks, rows_per_group, K;
  int M;
  void* y;
  int64_t ldy;
  int y_bf16, y_vec;
  float out_scale;
  // split-K: blockIdx.z takes chunks [z*chunks_per_split, ...); partial tiles
  // [ksplit][tiles][128 x BN] f32, the last CTA of a tile to arrive sums them in
  // split order (deterministic) and writes y; counters return to zero.
  int ksplit, chunks_per_split;
  float* partials;
  unsigned* counters;
};

// Expands this lane's share of one packed 16-row x 64-k block (rows g, g+8;
// k = 16t .. 16t+15) to BF16 (value * scale * 2^-26, exact) and stores it
// into the 128-byte-swizzled A tile: row r's 16-byte unit u lands at unit
// u ^ (r % 8), the layout TMA's SWIZZLE_128B makes and wgmma reads.
__device__ __forceinline__ void expand_to_smem(const uint8_t* wrb, const uint8_t* srb, uint8_t* atile, int row0, int g,
                                               int t) {
  const int lane = g * 4 + t;
  const uint4 wv = *reinterpret_cast<const uint4*>(wrb + lane * 16);
  const uint32_t sv = *reinterpret_cast<const uint16_t*>(srb + lane * 2);
  uint32_t sg, sg8;
  sm90::decode_scales(sv, sg, sg8);
  const uint32_t ws[4] = {wv.x, wv.y, wv.z, wv.w};
  uint32_t r0[8], r1[8];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    uint32_t a[4];
    sm90::expand_word(ws[j], sg, sg8, a);
    r0[2 * j] = a[0];
    r0[2 * j + 1] = a[2];
    r1[2 * j] = a[1];
    r1[2 * j + 1] = a[3];
  }
  const int ra = row0 + g, rb = ra + 8;  // ra % 8 == rb % 8 == g
  uint8_t* pa = atile + ra * 128;
  uint8_t* pb = atile + rb * 128;
  const int u0 = ((2 * t) ^ g) * 16, u1 = ((2 * t + 1) ^ g) * 16;
  *reinterpret_cast<uint4*>(pa + u0) = make_uint4(r0[0], r0[1], r0[2], r0[3]);
  *reinterpret_cast<uint4*>(pa + u1) = make_uint4(r0[4], r0[5], r0[6], r0[7]);
  *reinterpret_cast<uint4*>(pb + u0) = make_uint4(r1[0], r1[1], r1[2], r1[3]);
  *reinterpret_cast<uint4*>(pb + u1) = make_uint4(r1[4], r1[5], r1[6], r1[7]);
}

template <int BN>
__global__ void __launch_bounds__(384, 1) nvfp4_wgmma_kernel(const __grid_constant__ CUtensorMap xmap,
                                                             const WgmmaParams p) {
  using T = Tile<BN>;
  constexpr int S = T::kStages;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  const uint32_t sbase = smem_u32(smem);
  const uint32_t full0 = sbase + T::kBarOff, empty0 = full0 + S * 8;

  const int rt = blockIdx.x, tt = blockIdx.y;
  const int rb0 = rt * kRowBlocks, tok0 = tt * BN;
  const int nrb = min(kRowBlocks, p.row_blocks - rb0);
  const int xcol0 = (rb0 * 16 / p.rows_per_group) * p.K;
  const int wg = threadIdx.x / 128, lane = threadIdx.x & 31;
  const int64_t c_begin = int64_t(blockIdx.z) * p.chunks_per_split;
  const int64_t c_end = min(p.chunks, c_begin + p.chunks_per_split);

  if (threadIdx.x == 0) {
    for (int i = 0; i < S; ++i) {
      mbar_init(full0 + 8 * i, 1);
      mbar_init(empty0 + 8 * i, 8);  // one arrival per consumer warp
    }
    mbar_init_fence();
  }
  __syncthreads();

  if (wg == 0) {
    // Producer: one warp issues all copies.
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
    if (threadIdx.x < 32) {
      if (lane == 0) asm volatile("prefetch.tensormap [%0];" ::"l"(&xmap) : "memory");
      const uint32_t tx = uint32_t(T::kXStage + nrb * (512 + 64));
      for (int64_t c = c_begin; c < c_end; ++c) {
        const int st = int((c - c_begin) % S);
        const uint32_t ph = uint32_t((c - c_begin) / S) & 1u;
        const uint32_t full = full0 + 8 * st;
        if (lane == 0) {
          mbar_wait(empty0 + 8 * st, ph ^ 1u);
          mbar_expect_tx(full, tx);
          tma_load_2d(sbase + T::kXOff + st * T::kXStage, &xmap, xcol0 + int(c) * 64, tok0, full);
        }
        __syncwarp();
        if (lane < nrb) {
          const int64_t unit = int64_t(rb0 + lane) * p.chunks + c;
          bulk_load(sbase + T::kWOff + st * kWStage + lane * 512, p.w + unit * 512, 512, full);
          bulk_load(sbase + T::kSOff + st * kSStage + lane * 64, p.s + unit * 64, 64, full);
        }
      }
    }
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
  const int cw = wg - 1;                        // consumer index 0/1: weight rows 64*cw ..
  const int w4 = (threadIdx.x >> 5) & 3;        // warp within the warpgroup: rows 16*w4 ..
  const int g = lane >> 2, t = lane & 3;
  const int rbl = cw * 4 + w4;                  // row block within the tile
  // No zero fill: the first wgmma of the CTA's first chunk overwrites (scale-d
  // = 0); every CTA has at least one chunk. (Zero-filled accumulators made
  // ptxas serialize the 128-wide variant, C7515.)
  float acc[BN / 2];
  // Chunk c: expand into A buffer c%2 while chunk c-1's wgmmas run, make the
  // stores visible to the async proxy, sync the warpgroup, issue chunk c,
  // then wait for chunk c-1 only (its A buffer and stage become free).
  uint8_t* abuf = smem + T::kAOff + cw * 2 * kATile;
  const uint32_t abuf_u32 = smem_u32(abuf);
  for (int64_t c = c_begin; c < c_end; ++c) {
    const int i = int(c - c_begin);
    const int st = i % S;
    mbar_wait(full0 + 8 * st, uint32_t(i / S) & 1u);
    expand_to_smem(smem + T::kWOff + st * kWStage + rbl * 512, smem + T::kSOff + st * kSStage + rbl * 64,
                   abuf + (i & 1) * kATile, 16 * w4, g, t);
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    named_barrier(2 + cw, 128);
    const uint64_t da = desc_sw128(abuf_u32 + (i & 1) * kATile);
    const uint64_t db = desc_sw128(sbase + T::kXOff + st * T::kXStage);
    wgmma_fence();
#pragma unroll
    for (int s = 0; s < 4; ++s)  // k16 step s starts 32 bytes further into the swizzled rows
      sm90::WgmmaSS<BN>::mma(acc, da + uint64_t(2 * s), db + uint64_t(2 * s), (i > 0 || s > 0) ? 1 : 0);
    wgmma_commit();
    wgmma_wait<1>();
    if (i > 0 && lane == 0) mbar_arrive(empty0 + 8 * ((i - 1) % S));  // chunk c-1 is done with its stage
  }
  wgmma_wait<0>();
  fence_regs(acc);

  // Epilogue: stage [BN tokens][64 rows] per consumer through shared memory
  // (all stage buffers are idle: every load was consumed), then write rows of y.
  named_barrier(1, 256);
  float* stage = reinterpret_cast<float*>(smem) + cw * BN * kStagePad;
  const int r0 = 16 * w4 + g;
#pragma unroll
  for (int i = 0; i < BN / 8; ++i) {
    const int tok = 8 * i + 2 * t;
    stage[tok * kStagePad + r0] = acc[4 * i + 0];
    stage[(tok + 1) * kStagePad + r0] = acc[4 * i + 1];
    stage[tok * kStagePad + r0 + 8] = acc[4 * i + 2];
    stage[(tok + 1) * kStagePad + r0 + 8] = acc[4 * i + 3];
  }
  named_barrier(2 + cw, 128);
  const int tid = threadIdx.x & 127;
  const int col = (tid & 15) * 4;
  const int n = rb0 * 16 + cw * 64 + col;
  if (p.ksplit > 1) {
    const int tile = blockIdx.y * gridDim.x + blockIdx.x, tiles = gridDim.x * gridDim.y;
    float* part = p.partials + (int64_t(blockIdx.z) * tiles + tile) * (kBM * BN) + cw * (64 * BN);
    for (int r = tid >> 4; r < BN; r += 8)
      *reinterpret_cast<float4*>(part + r * 64 + col) = *reinterpret_cast<const float4*>(stage + r * kStagePad + col);
    __threadfence();
    named_barrier(1, 256);
    __shared__ int is_last;
    if (threadIdx.x == 128) is_last = atomicAdd(&p.counters[tile], 1u) == unsigned(p.ksplit - 1);
    named_barrier(1, 256);
    if (!is_last) return;
    __threadfence();
    for (int r = tid >> 4; r < BN; r += 8) {
      float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
      for (int z = 0; z < p.ksplit; ++z) {
        const float4 q = __ldcg(reinterpret_cast<const float4*>(p.partials + (int64_t(z) * tiles + tile) * (kBM * BN) +
                                                                cw * (64 * BN) + r * 64 + col));
        v.x += q.x;
        v.y += q.y;
        v.z += q.z;
        v.w += q.w;
      }
      *reinterpret_cast<float4*>(stage + r * kStagePad + col) = v;
    }
    if (threadIdx.x == 128) p.counters[tile] = 0;  // ready for the next launch
  }
  for (int r = tid >> 4; r < BN; r += 8) {
    const int tok = tok0 + r;
    if (tok >= p.M) break;
    const float4 v = *reinterpret_cast<const float4*>(stage + r * kStagePad + col);
    const float o[4] = {v.x * p.out_scale, v.y * p.out_scale, v.z * p.out_scale, v.w * p.out_scale};
    if (p.y_bf16) {
      __nv_bfloat16* yr = static_cast<__nv_bfloat16*>(p.y) + int64_t(tok) * p.ldy;
      if (p.y_vec && n + 3 < p.N) {
        __nv_bfloat162 lo = __floats2bfloat162_rn(o[0], o[1]), hi = __floats2bfloat162_rn(o[2], o[3]);
        uint2 u;
        u.x = *reinterpret_cast<uint32_t*>(&lo);
        u.y = *reinterpret_cast<uint32_t*>(&hi);
        *reinterpret_cast<uint2*>(yr + n) = u;
      } else {
        for (int j = 0; j < 4; ++j)
          if (n + j < p.N) yr[n + j] = __float2bfloat16_rn(o[j]);
      }
    } else {
      float* yr = static_cast<float*>(p.y) + int64_t(tok) * p.ldy;
      if (p.y_vec && n + 3 < p.N) {
        *reinterpret_cast<float4*>(yr + n) = make_float4(o[0], o[1], o[2], o[3]);
      } else {
        for (int j = 0; j < 4; ++j)
          if (n + j < p.N) yr[n + j] = o[j];
      }
    }
  }
}

template <int BN>
void launch(Context& ctx, const DeviceLinear& w, const uint16_t* x, int64_t M, int64_t ldx, void* y, int64_t ldy,
            OutType out, int64_t ksplit) {
  using T = Tile<BN>;
  const CUtensorMap map = encode_tensor_map_2d(CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, x, uint64_t(w.groups * w.K),
                                               uint64_t(M), uint64_t(ldx) * 2, 64, BN, CU_TENSOR_MAP_SWIZZLE_128B,
                                               w.name.c_str());
  WgmmaParams p{};
  p.w = w.data.as<const uint8_t>();
  p.s = w.scales.as<const uint8_t>();
  p.chunks = w.chunks;
  p.N = int(w.N);
  p.row_blocks = int(w.row_blocks);
  p.rows_per_group = int(w.N / w.groups);
  p.K = int(w.K);
  p.M = int(M);
  p.y = y;
  p.ldy = ldy;
  p.y_bf16 = out == OutType::BF16;
  const size_t es = out == OutType::BF16 ? 2 : 4;
  p.y_vec = (ldy % 4 == 0) && (reinterpret_cast<uintptr_t>(y) % (4 * es) == 0);
  p.out_scale = kEpilogueFactor * w.scale_2;
  const int64_t per = (w.chunks + ksplit - 1) / ksplit;
  ksplit = (w.chunks + per - 1) / per;
  p.ksplit = int(ksplit);
  p.chunks_per_split = int(per);
  const dim3 grid(unsigned((w.N + kBM - 1) / kBM), unsigned((M + BN - 1) / BN), unsigned(ksplit));
  if (ksplit > 1) {
    const size_t tiles = size_t(grid.x) * grid.y;
    p.partials = ctx.splitk_partials(size_t(ksplit) * tiles * kBM * BN);
    p.counters = ctx.splitk_counters(tiles);
  }
  nvfp4_wgmma_kernel<BN><<<grid, 384, T::kSmem, ctx.stream()>>>(map, p);
  CM_CUDA_LAUNCH("nvfp4_wgmma_kernel");
}

}  // namespace

CUtensorMap encode_tensor_map_2d(CUtensorMapDataType type, const void* base, uint64_t inner, uint64_t outer,
                                 uint64_t row_bytes, uint32_t box_inner, uint32_t box_outer, CUtensorMapSwizzle swizzle,
                                 const char* name) {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
    cudaDriverEntryPointQueryResult q{};
    void* f = nullptr;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q) == cudaSuccess &&
        q == cudaDriverEntryPointSuccess)
      fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  });
  CM_CU_CHECK(fn != nullptr, "the CUDA driver does not provide cuTensorMapEncodeTiled");
  CUtensorMap map;
  const cuuint64_t dims[2] = {inner, outer};
  const cuuint64_t strides[1] = {row_bytes};
  const cuuint32_t box[2] = {box_inner, box_outer};
  const cuuint32_t estr[2] = {1, 1};
  const CUresult r = fn(&map, type, 2, const_cast<void*>(base), dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
                        swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  CM_CU_CHECK(r == CUDA_SUCCESS, "linear '%s': cuTensorMapEncodeTiled failed (%d)", name, int(r));
  return map;
}

void setup_wgmma_kernels() {
  CM_CUDA(cudaFuncSetAttribute(nvfp4_wgmma_kernel<64>, cudaFuncAttributeMaxDynamicSharedMemorySize, Tile<64>::kSmem));
  CM_CUDA(cudaFuncSetAttribute(nvfp4_wgmma_kernel<128>, cudaFuncAttributeMaxDynamicSharedMemorySize, Tile<128>::kSmem));
  CM_CUDA(cudaFuncSetAttribute(nvfp4_wgmma_kernel<256>, cudaFuncAttributeMaxDynamicSharedMemorySize, Tile<256>::kSmem));
}

bool wgmma_nvfp4_supported(const DeviceLinear& w, int64_t M) {
  if (M <= 0 || M >= (int64_t(1) << 31)) return false;
  if (w.groups == 1) return true;
  // each CTA's 128 rows must read one group's K slice, which must not run into the next
  return (w.N / w.groups) % kBM == 0 && w.K % 64 == 0;
}

void linear_nvfp4_wgmma(Context& ctx, const DeviceLinear& w, const uint16_t* x, int64_t M, int64_t ldx, void* y,
                        int64_t ldy, OutType out) {
  CM_CU_CHECK(wgmma_nvfp4_supported(w, M),
              "linear '%s': the wgmma kernel needs each group's rows to be a multiple of %d and K of 64", w.name.c_str(),
              kBM);
  // Pick token tile width and K split by a wave model: the fraction of SM
  // slots busy over the waves, times how well a tile width uses the tensor
  // cores (wider is better: same B traffic per MMA, fewer epilogues), times
  // the used part of the last token tile, with a small charge for split-K.
  const int64_t row_tiles = (w.N + kBM - 1) / kBM, sms = ctx.sm_count();
  int best_bn = 64;
  int64_t best_split = 1;
  double best = -1;
  for (int bn : {256, 128, 64}) {
    const int64_t ttiles = (M + bn - 1) / bn;
    const double tile_eff = bn == 256 ? 1.0 : bn == 128 ? 0.85 : 0.6;
    const double fill = double(M) / double(ttiles * bn);
    for (int64_t ks = 1; ks <= std::max<int64_t>(1, w.chunks / 8); ++ks) {  // >= 8 chunks per split
      const int64_t tiles = row_tiles * ttiles * ks;
      if (ks > 1 && tiles > 2 * sms) break;
      const int64_t waves = (tiles + sms - 1) / sms;
      const double score = double(tiles) / double(waves * sms) * tile_eff * fill * (ks > 1 ? 0.95 : 1.0);
      if (score > best + 1e-9) {
        best = score;
        best_bn = bn;
        best_split = ks;
      }
    }
  }
  if (best_bn == 256) return launch<256>(ctx, w, x, M, ldx, y, ldy, out, best_split);
  if (best_bn == 128) return launch<128>(ctx, w, x, M, ldx, y, ldy, out, best_split);
  launch<64>(ctx, w, x, M, ldx, y, ldy, out, best_split);
}

}  // namespace cm::cuda
