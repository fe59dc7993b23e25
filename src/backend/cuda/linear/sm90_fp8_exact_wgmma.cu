// FP8 128x128-block linear on wgmma with the decode kernel's bits (linear.h, linear_fp8_exact_wgmma).
//
// The FP8 decode kernel (sm90_decode.cuh with Fp8Format) sums, per 16-row block and K split, four warp
// chains (warp kw: chunks kw, kw + 4, ...); for each chunk a zeroed fp32 tile takes the four m16n8k16
// steps of the expanded E4M3 codes (fp8_chunk_mma) and is added as acc = fma(tile, block scale, acc);
// warps meet as (w0 + w1) + (w2 + w3) and splits as 0 + v0 + v1 + ... (one split: v0). This kernel
// runs the same operations with wgmma, as the NVFP4 one does (sm90_nvfp4_exact_wgmma.cu, which says
// why the order holds): weights as the register A operand in the decode kernel's fragments
// (fp8_step_a), activations reordered into its k positions (sm90_exact_wgmma.cuh), four chain
// accumulators per output in one CTA.
//
// CTA = 3 warpgroups over 128 weight rows (one 128-row scale block) x 64 tokens: warpgroup 0 produces
// (one thread: the bulk copy of the x tile and one tensor copy of the 8 row blocks' codes per chunk, S
// stages); warpgroups 1 and 2 consume rows 0-63 and 64-127: per chunk, a zeroed m64n64 tile takes the
// four wgmmas while the next chunk is expanded, then is fma'd into its chain with the chunk's scale.
// Registers: 4 x 32 chain accumulators, the 32-float chunk tile and two chunks' A fragments; the
// running split total lives in shared memory (each thread its own slots).
#include <cuda.h>

#include <algorithm>

#include "backend/cuda/core/kernel_setup.h"
#include "backend/cuda/linear/linear.h"
#include "backend/cuda/linear/linear_host.cuh"
#include "backend/cuda/linear/sm90_exact_wgmma.cuh"
#include "backend/cuda/linear/sm90_fp8.cuh"
#include "backend/cuda/linear/sm90_mbarrier.cuh"
#include "backend/cuda/linear/sm90_tma.cuh"
#include "backend/cuda/linear/sm90_wgmma.cuh"

namespace cm::cuda {

namespace {

using namespace sm90;
using exact_wgmma::kToks;
using exact_wgmma::kXTile;

constexpr int kRows = 128;              // weight rows per tile: one scale block
constexpr int kRB = kRows / 16;         // packed row blocks per tile
constexpr int kStages = 6;
constexpr int kWStage = kRB * 1024;     // E4M3 codes of 8 row blocks x 64 k
constexpr int kMaxScaleCols = 512;      // K <= 65536
constexpr int kXOff = 0;
constexpr int kWOff = kXOff + kStages * kXTile;
constexpr int kTotOff = kWOff + kStages * kWStage;      // f32 [2 warpgroups][32][128]
constexpr int kScaleOff = kTotOff + 2 * 32 * 128 * 4;   // f32 [kMaxScaleCols]
constexpr int kBarOff = kScaleOff + kMaxScaleCols * 4;
constexpr int kBytes = kBarOff + 2 * kStages * 8;
constexpr int kSmem = kBytes + 1024;
static_assert(kXTile % 1024 == 0 && kWOff % 1024 == 0, "swizzled tiles: 1024-byte aligned");
static_assert(kSmem <= 227 * 1024, "shared memory per block");

struct Fp8ExactParams {
  const float* s;     // f32 block scales [scale_rows][scale_cols]
  const uint8_t* xp;  // reordered activation tiles [token tile][group chunk][kXTile bytes]
  void* y;
  int64_t ldy;
  int chunks, N, row_blocks, rbg, M, gchunks, scale_cols;
  int ksplit, per;
  int y_bf16;
};

__global__ void __launch_bounds__(384, 1) fp8_exact_wgmma_kernel(const __grid_constant__ CUtensorMap wmap,
                                                                 const Fp8ExactParams p) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = exact_wgmma::align_1024(smem_raw);
  const uint32_t sbase = smem_u32(smem);
  const uint32_t full0 = sbase + kBarOff, empty0 = full0 + kStages * 8;
  const int rb0 = blockIdx.x * kRB, tt = blockIdx.y;
  const int grp = rb0 / p.rbg;  // a tile never straddles groups (host check)
  const int nrb = min(kRB, p.row_blocks - rb0);
  const int wg = threadIdx.x / 128, lane = threadIdx.x & 31;
  float* srow = reinterpret_cast<float*>(smem + kScaleOff);
  // The tile's scale row (weights never come from an earlier kernel: read before the dependency wait).
  for (int i = threadIdx.x; i < p.scale_cols; i += blockDim.x) srow[i] = p.s[int64_t(rb0 / 8) * p.scale_cols + i];
  if (threadIdx.x == 0) exact_wgmma::init_ring(full0, empty0, kStages);
  __syncthreads();
  asm volatile("griddepcontrol.wait;" ::: "memory");

  if (wg == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
    if (threadIdx.x == 0) {
      asm volatile("prefetch.tensormap [%0];" ::"l"(&wmap) : "memory");
      constexpr uint32_t tx = kXTile + kWStage;
      const uint8_t* xt = p.xp + (int64_t(tt) * p.gchunks + int64_t(grp) * p.chunks) * kXTile;
      exact_wgmma::produce(p.chunks, kStages, full0, empty0, tx, sbase + kXOff, xt, [&](int c, int st, uint32_t full) {
        tma_load_2d(sbase + kWOff + st * kWStage, &wmap, c * 256, rb0, full);
      });
    }
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
  const int cw = wg - 1, w4 = (threadIdx.x >> 5) & 3, g = lane >> 2, t = lane & 3;
  const int rb = 4 * cw + w4;  // this warp's row block in the tile
  const bool present = rb < nrb;
  float* tot = reinterpret_cast<float*>(smem + kTotOff) + cw * 32 * 128 + (threadIdx.x & 127);
  float acc[4][32], tmp[32];
  uint32_t af[2][4][4] = {};  // A fragments of two chunks (absent row blocks: zeros)
  // This warp's A fragments of chunk c (fp8_step_a: the decode kernel's operands).
  auto expand = [&](int c, uint32_t(&a)[4][4]) {
    const int st = c % kStages;
    mbar_wait(full0 + 8 * st, uint32_t(c / kStages) & 1u);
    if (!present) return;
    const uint8_t* wst = smem + kWOff + st * kWStage + rb * 1024;
    const uint4 w0 = *reinterpret_cast<const uint4*>(wst + lane * 16);
    const uint4 w1 = *reinterpret_cast<const uint4*>(wst + 512 + lane * 16);
#pragma unroll
    for (int j = 0; j < 4; ++j) fp8_step_a(w0, w1, j, a[j]);
  };
  for (int s = 0; s < p.ksplit; ++s) {
    const int cb = s * p.per, ce = min(p.chunks, cb + p.per);
#pragma unroll
    for (int kw = 0; kw < 4; ++kw)
#pragma unroll
      for (int i = 0; i < 32; ++i) acc[kw][i] = 0.f;
    if (cb < ce) expand(cb, af[0]);
    for (int c0 = cb; c0 < ce; c0 += 4) {
#pragma unroll
      for (int kw = 0; kw < 4; ++kw) {
        const int c = c0 + kw;
        if (c >= ce) break;
        const int st = c % kStages;
#pragma unroll
        for (int i = 0; i < 32; ++i) tmp[i] = 0.f;
        const uint64_t db = desc_sw128(sbase + kXOff + st * kXTile);
        wgmma_fence();
#pragma unroll
        for (int j = 0; j < 4; ++j) WgmmaRS<kToks>::mma(tmp, af[kw & 1][j], db + uint64_t(2 * j), 1);
        wgmma_commit();
        if (c + 1 < ce) expand(c + 1, af[(kw + 1) & 1]);  // while the wgmmas run
        wgmma_wait<0>();
        fence_regs(tmp);
        __syncwarp();
        if (lane == 0) mbar_arrive(empty0 + 8 * st);
        const float sc = srow[c >> 1];
#pragma unroll
        for (int i = 0; i < 32; ++i) acc[kw][i] = fmaf(tmp[i], sc, acc[kw][i]);
      }
    }
#pragma unroll
    for (int i = 0; i < 32; ++i)
      tot[i * 128] = exact_wgmma::add_split(tot[i * 128], exact_wgmma::chains_sum(acc, i), s, p.ksplit);
  }
  if (!present) return;
  float v[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) v[i] = tot[i * 128];
  // The decode kernel stores its sums times a literal 1 (Fp8Format::kScaledOutput is false).
  exact_wgmma::store_fragment(v, tt * kToks, (rb0 + rb) * 16 + g, t, p.M, p.N, p.y, p.ldy, p.y_bf16 != 0, 1.0f);
}

}  // namespace

void setup_fp8_exact_wgmma_kernels() {
  CM_CUDA(cudaFuncSetAttribute(fp8_exact_wgmma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
}

const char* exact_wgmma_fp8_unsupported(Context& ctx, const DeviceFp8Linear& w, int64_t M) {
  if (M <= 0 || M >= (int64_t(1) << 31)) return "M out of range";
  if (w.K % 16 != 0) return "K is not a multiple of 16";
  if (w.scale_cols > kMaxScaleCols) return "more than 512 scale blocks along K";
  if (w.groups > 1 && (w.N / w.groups) % kRows != 0) return "grouped weights need groups of a multiple of 128 rows";
  if (!exact_wgmma::fits_scratch(ctx, w.chunks, w.groups))
    return "the reordered activations of one 64-token tile do not fit the scratch";
  return nullptr;
}

void linear_fp8_exact_wgmma(Context& ctx, const DeviceFp8Linear& w, const uint16_t* x, int64_t M, int64_t ldx, void* y,
                            int64_t ldy, OutType out) {
  const char* why = exact_wgmma_fp8_unsupported(ctx, w, M);
  CM_CU_CHECK(why == nullptr, "linear '%s': the exact wgmma kernel does not take it: %s", w.name.c_str(),
              why ? why : "");
  CM_CU_CHECK(ldx >= w.groups * w.K && ldy >= w.N, "linear '%s': leading dimensions too small", w.name.c_str());
  const int64_t per = fp8_chunks_per_split(ctx, w);
  Fp8ExactParams p{};
  p.s = w.scales.as<const float>();
  p.ldy = ldy;
  p.chunks = int(w.chunks);
  p.gchunks = int(w.groups * w.chunks);
  p.scale_cols = int(w.scale_cols);
  p.N = int(w.N);
  p.row_blocks = int(w.row_blocks);
  p.rbg = int(w.groups > 1 ? w.N / w.groups / 16 : w.row_blocks);
  p.per = int(per);
  p.ksplit = int((w.chunks + per - 1) / per);
  p.y_bf16 = out == OutType::BF16;
  const size_t es = out == OutType::BF16 ? 2 : 4;
  // Codes [row_blocks][chunks x 1024 bytes] as u32 rows; one box is a chunk of 8 row blocks.
  const CUtensorMap wmap = encode_tensor_map_2d(CU_TENSOR_MAP_DATA_TYPE_UINT32, w.data.get(), uint64_t(w.chunks) * 256,
                                                uint64_t(w.row_blocks), uint64_t(w.chunks) * 1024, 256, kRB,
                                                CU_TENSOR_MAP_SWIZZLE_NONE, w.name.c_str());
  const unsigned row_tiles = unsigned((w.row_blocks + kRB - 1) / kRB);
  exact_wgmma::for_each_slab(ctx, x, ldx, M, int(w.K), w.chunks, w.groups,
                             [&](int64_t m0, int64_t mm, const uint8_t* xp) {
                               p.xp = xp;
                               p.M = int(mm);
                               p.y = static_cast<uint8_t*>(y) + size_t(m0) * size_t(ldy) * es;
                               launch_kernel(ctx, fp8_exact_wgmma_kernel,
                                             dim3(row_tiles, unsigned((mm + kToks - 1) / kToks)), dim3(384), kSmem,
                                             "fp8_exact_wgmma_kernel", wmap, p);
                             });
}

}  // namespace cm::cuda
