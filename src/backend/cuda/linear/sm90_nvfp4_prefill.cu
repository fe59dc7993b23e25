// NVFP4 linear prefill kernel with the decode kernel's bits (see linear.h,
// linear_nvfp4_tiles).
//
// Why: the engine needs a token's logits not to depend on how many rows share
// a step or how a prompt was chunked, so the model ran the mma.sync decode
// kernel at every M; at prefill that re-reads and re-expands every FP4 weight
// chunk once per 32-token slice (50-105 TFLOP/s at M = 2048). This kernel
// takes a tile of 64 tokens and 128 weight rows per CTA: each weight chunk is
// loaded and expanded once per 64 tokens and each activation read from L2
// once per 128 rows.
//
// CTA = 8 warps: 2 row groups (r) x 4 K warps (kw); each warp multiplies four
// 16-row blocks (eight mma per 16-byte activation read from shared memory, so
// shared memory keeps up with the mma; 128 accumulators per thread, 255
// registers, no spills, one CTA per SM). Stage s holds 4 consecutive chunks
// of one K split: the tile's activations of all four and each warp's own
// weight chunks and scales, copied by cp.async, three stages in flight.
// Persistent CTAs (one per SM) loop over (row group, token tile) items and
// keep the pipeline running from one item into the next, so the pipeline
// fill and the epilogue are paid once per CTA rather than once per tile (wq_b
// has only 4 stages per tile).
//
// Bit identity with the decode kernel (decode_kernel<Nvfp4Format> of
// sm90_decode.cuh) for every output, whatever the tile:
//  - the K split is decode_split's (linear_host.cuh): the same ksplit and
//    chunks per split as the decode launches of this weight on this device;
//  - within a split, warp kw walks chunks c_begin + kw, c_begin + kw + 4, ...
//    in increasing order, each with mma steps j = 0..3 on the same A (expanded
//    weight) and B (activation) fragments (smem_chunk_mma = chunk_mma's order);
//    an mma output element depends only on its own row of A and column of B,
//    so the token's position in the tile does not matter;
//  - at the end of each split the 4 warps' sums meet in reduce_warps_group's
//    (w0 + w1) + (w2 + w3) order, and the split values are summed as
//    splitk_combine does: 0.f + v0 + v1 + ... in split order (one split: v0
//    itself); then the same out_scale multiply and bf16/f32 store.
// The decode kernel's CTAs write split partials to global memory and the last
// one adds them; here one CTA holds all splits of its tile in turn, so no
// workspace and no counters.
#include <cuda_bf16.h>

#include <algorithm>

#include "backend/cuda/linear/linear.h"
#include "backend/cuda/core/kernel_setup.h"
#include "backend/cuda/linear/linear_host.cuh"
#include "backend/cuda/core/ops_device.cuh"
#include "backend/cuda/linear/sm90_nvfp4.cuh"

namespace cm::cuda {

namespace {

constexpr int kMT = 8;                       // 8 groups of 8 tokens per tile
constexpr int kTile = 8 * kMT;               // tokens per tile
constexpr int kNA = 4;                       // 16-row blocks per warp
constexpr int kRG = 2;                       // row groups per CTA
constexpr int kRowBlocks = kRG * kNA;        // 16-row blocks per CTA
constexpr int kWarps = 4 * kRG;              // 4 K warps per row group
constexpr int kThreads = 32 * kWarps;
constexpr int kXRows = kThreads / 8;         // token rows one pass of 16-byte copies covers
constexpr int kXPasses = kTile / kXRows;
constexpr int kPitch = 72;                   // bf16 per staged token row (64 + 8: conflict-free 16-byte reads)
constexpr int kXBytes = 4 * kTile * kPitch * 2;  // a stage's activations: 4 chunks of the tile
constexpr int kWBytes = kWarps * kNA * 512;  // each warp's chunk of its row blocks
constexpr int kSBytes = kWarps * kNA * 64;   // and their scales
constexpr int kBufBytes = kXBytes + kWBytes + kSBytes;
constexpr int kBufs = 3;                     // stages in flight
constexpr int kHalf = kMT / 2;               // token groups per reduce_warps_group call
constexpr int kRedBytes = kRG * 4 * 8 * kHalf * 16 * 4;  // its area, per row group
constexpr int kTotBytes = kNA * kMT * kThreads * 4;  // each thread's sums over the splits so far
constexpr size_t kSmem = size_t(kBufs) * kBufBytes + kRedBytes + kTotBytes;
static_assert(kSmem <= 227 * 1024, "fits Hopper's 227 KB of shared memory per CTA");
static_assert(kBufBytes % 16 == 0 && kXBytes % 16 == 0, "16-byte cp.async alignment");
static_assert(kTile % kXRows == 0 && 4 * kNA <= 32, "staging layout");

struct TileParams {
  const uint4* w;            // packed weight (nvfp4_pack.h)
  const uint16_t* s;         // its scale pairs
  const __nv_bfloat16* x;    // [M, ldx]
  void* y;                   // [M, ldy], bf16 (y_bf16) or f32
  int64_t ldx, ldy;
  int chunks, N, K, M, y_bf16;
  int groups;
  int rbg;                   // row blocks per group (all of them when groups == 1)
  int cpg;                   // row groups (of 8 row blocks) per group
  int items;                 // work items: groups * cpg row groups x token tiles
  float out_scale;           // the decode kernel's epilogue factor
  int ksplit, per;           // decode_split: splits, chunks per split
  int spp;                   // stages per split (the last split may have fewer)
  int stages;                // stages in all
};

// Stage st's split and chunk range: chunks c0 .. c0+3 of split sp, whose end is cend.
__device__ __forceinline__ void stage_chunks(const TileParams& p, int st, int& c0, int& cend) {
  const int sp = min(st / p.spp, p.ksplit - 1);
  c0 = sp * p.per + 4 * (st - sp * p.spp);
  cend = min(p.chunks, (sp + 1) * p.per);
}

// A work item's row blocks and tokens. Items are numbered tile-major (item =
// tile * groups * cpg + row group), so the CTAs running at one time share a
// few token tiles of x in L2. Row group i: row blocks [8 (i % cpg), +8) of
// group i / cpg; warp row r takes 4 of them, a = 0..3, those past the group's
// last row block (rok false) read zeros and write nothing.
struct Item {
  int grp, rbl0, m0;  // group, this warp's first row block in it, first token
};
__device__ __forceinline__ Item item_of(const TileParams& p, int it, int r) {
  const int rgs = p.groups * p.cpg, rg = it % rgs;
  return Item{rg / p.cpg, (rg % p.cpg) * kRowBlocks + r * kNA, (it / rgs) * kTile};
}

// Persistent: CTA b takes items b, b + gridDim.x, ... and runs their stages
// back to back through one cp.async pipeline (the next item's first stages
// load while this item's last stage computes and its epilogue stores).
__global__ void __launch_bounds__(kThreads, 1) nvfp4_prefill_kernel(const TileParams p) {
  using namespace sm90;
  extern __shared__ __align__(16) unsigned char tl_smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int kw = warp & 3, r = warp >> 2;
  const int mine = (p.items - int(blockIdx.x) + int(gridDim.x) - 1) / int(gridDim.x);  // items of this CTA
  const int total = mine * p.stages;
  // Activations: thread i copies 16 bytes (piece i%8) of token rows
  // i/8 + kXRows*j of each of the stage's 4 chunks; absent tokens and k past
  // K are zeros (as the decode kernel's loads: k past K of this group's slice
  // must not be read).
  const int srow = threadIdx.x >> 3, piece = threadIdx.x & 7;
  // Shared addresses of this thread's copies in buffer 0: x row piece, weight
  // lane, and (lanes 0..4NA-1) a quarter of a row block's 64 scale bytes.
  const uint32_t sm0 = uint32_t(__cvta_generic_to_shared(tl_smem));
  const uint32_t xdst = sm0 + uint32_t(srow * kPitch + 8 * piece) * 2;
  const uint32_t wdst = sm0 + uint32_t(kXBytes + warp * kNA * 512 + lane * 16);
  const int sa = lane < 4 * kNA ? lane / 4 : 0;
  const uint32_t sdst = sm0 + uint32_t(kXBytes + kWBytes + (warp * kNA + sa) * 64 + (lane % 4) * 16);
  // x is written by the previous kernel (programmatic dependent launch).
  dev::pdl_wait_and_release();
  // Stage gs of this CTA: stage gs % stages of its item gs / stages.
  auto stage = [&](int gs) {
    if (gs < total) {
      const int ki = gs / p.stages;
      const Item im = item_of(p, int(blockIdx.x) + ki * int(gridDim.x), r);
      int c0, cend;
      stage_chunks(p, gs - ki * p.stages, c0, cend);
      const uint32_t bo = uint32_t((gs % kBufs) * kBufBytes);
      const __nv_bfloat16* const xg = p.x + int64_t(im.grp) * p.K + 8 * piece;
#pragma unroll
      for (int j = 0; j < kXPasses; ++j) {
        const int m = im.m0 + srow + kXRows * j;
        const __nv_bfloat16* const src = xg + int64_t(m < p.M ? m : 0) * p.ldx;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int c = c0 + q;
          const bool ok = m < p.M && c < cend && c * 64 + 8 * piece < p.K;
          cp_async16(xdst + bo + (q * kTile + kXRows * j) * kPitch * 2, ok ? src + int64_t(c) * 64 : src,
                     ok ? 16 : 0);
        }
      }
      const int c = c0 + kw;
      const bool cin = c < cend;
#pragma unroll
      for (int a = 0; a < kNA; ++a) {
        const bool rok = im.rbl0 + a < p.rbg;
        const bool ok = cin && rok;
        const uint32_t rb = uint32_t(im.grp * p.rbg + (rok ? im.rbl0 + a : 0));
        cp_async16(wdst + bo + a * 512, p.w + ((rb * uint32_t(p.chunks) + (ok ? uint32_t(c) : 0u)) * 32u + lane),
                   ok ? 16 : 0);
      }
      if (lane < 4 * kNA) {
        const bool ok = cin && im.rbl0 + sa < p.rbg;
        const uint32_t rb = uint32_t(im.grp * p.rbg + (ok ? im.rbl0 + sa : 0));
        cp_async16(sdst + bo, p.s + ((rb * uint32_t(p.chunks) + (ok ? uint32_t(c) : 0u)) * 32u + (lane % 4) * 8),
                   ok ? 16 : 0);
      }
    }
    asm volatile("cp.async.commit_group;" ::: "memory");  // empty past the end: the wait count stays uniform
  };
  float acc[kNA][kMT][4] = {};
  // The split sums live in shared memory (thread-private slots, conflict
  // free), not in registers: the accumulators take 128 of them already.
  float* const red = reinterpret_cast<float*>(tl_smem + kBufs * kBufBytes) + r * 4 * 8 * kHalf * 16;
  float* const tot = reinterpret_cast<float*>(tl_smem + kBufs * kBufBytes + kRedBytes) + threadIdx.x;
  const int tid = threadIdx.x & 127;
#pragma unroll
  for (int gs = 0; gs < kBufs - 1; ++gs) stage(gs);
  int st = 0, k = 0;  // the computed stage's index in its item, and the item's index in this CTA's list
  for (int gs = 0; gs < total; ++gs) {
    stage(gs + kBufs - 1);  // into the buffer computed at gs - 1 (released by its closing barrier)
    asm volatile("cp.async.wait_group %0;" ::"n"(kBufs - 1) : "memory");
    __syncthreads();
    int c0, cend;
    stage_chunks(p, st, c0, cend);
    if (c0 + kw < cend) {
      const unsigned char* const buf = tl_smem + (gs % kBufs) * kBufBytes;
      smem_chunk_mma<kNA, kMT>(buf + kXBytes + warp * kNA * 512, buf + kXBytes + kWBytes + warp * kNA * 64,
                               reinterpret_cast<const __nv_bfloat16*>(buf) + (kw * kTile + g) * kPitch + 16 * t,
                               kPitch, lane, acc);
    }
    __syncthreads();  // this buffer is staged again at gs + 1
    if (c0 + 4 >= cend) {
      // The split's last stage: its value, as the decode kernel's CTA for
      // this split reduces it, added to the item's sum in split order.
      // Reduced in halves of 32 tokens (a smaller area): value q of half h
      // is token tid/16 + 8 (4h + q), the same expression per element.
#pragma unroll
      for (int a = 0; a < kNA; ++a)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float v[kHalf];
          reduce_warps_group<kHalf>(reinterpret_cast<const float(&)[kHalf][4]>(acc[a][kHalf * h]), red, kw, tid, v);
#pragma unroll
          for (int q = 0; q < kHalf; ++q) {
            float& tq = tot[(a * kMT + kHalf * h + q) * kThreads];
            tq = p.ksplit == 1 ? v[q] : (st < p.spp ? 0.f : tq) + v[q];
          }
        }
#pragma unroll
      for (int a = 0; a < kNA; ++a)
#pragma unroll
        for (int q = 0; q < kMT; ++q) acc[a][q][0] = acc[a][q][1] = acc[a][q][2] = acc[a][q][3] = 0.f;
    }
    if (++st < p.stages) continue;
    // The item's last stage: value q of this thread is token tid/16 + 8q,
    // row tid%16 of each row block (store_tile's layout).
    const Item im = item_of(p, int(blockIdx.x) + k * int(gridDim.x), r);
    st = 0;
    ++k;
#pragma unroll
    for (int a = 0; a < kNA; ++a) {
      const int n = (im.grp * p.rbg + im.rbl0 + a) * 16 + tid % 16;
      if (im.rbl0 + a >= p.rbg || n >= p.N) continue;
#pragma unroll
      for (int q = 0; q < kMT; ++q) {
        const int m = im.m0 + tid / 16 + 8 * q;
        if (m >= p.M) continue;
        const float out = tot[(a * kMT + q) * kThreads] * p.out_scale;
        if (p.y_bf16)
          static_cast<__nv_bfloat16*>(p.y)[int64_t(m) * p.ldy + n] = __float2bfloat16_rn(out);
        else
          static_cast<float*>(p.y)[int64_t(m) * p.ldy + n] = out;
      }
    }
  }
  asm volatile("cp.async.wait_group 0;" ::: "memory");
}

}  // namespace

void setup_nvfp4_prefill_kernels() {
  CM_CUDA(cudaFuncSetAttribute(nvfp4_prefill_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmem)));
}

void linear_nvfp4_tiles(Context& ctx, const DeviceLinear& w, const uint16_t* x, int64_t M, int64_t ldx, void* y,
                        int64_t ldy, OutType out) {
  CM_CU_CHECK(ldx >= w.groups * w.K && ldy >= w.N, "linear '%s': leading dimensions too small", w.name.c_str());
  CM_CU_CHECK((ldx % 8) == 0 && (reinterpret_cast<uintptr_t>(x) % 16) == 0,
              "linear '%s': activations must be 16-byte aligned rows", w.name.c_str());
  CM_CU_CHECK(w.K % 16 == 0, "linear '%s': K (%lld) must be a multiple of 16", w.name.c_str(), (long long)w.K);
  CM_CU_CHECK(w.row_blocks * w.chunks * 32 < (int64_t(1) << 32), "linear '%s': weight too large for the prefill kernel",
              w.name.c_str());
  if (M <= 0) return;
  const SplitK sk = decode_split(ctx.sm_count(), ctx.setup().nvfp4_decode_occupancy, w.row_blocks, w.chunks);
  const int rbg = int(w.groups > 1 ? w.N / w.groups / 16 : w.row_blocks);
  const int cpg = (rbg + kRowBlocks - 1) / kRowBlocks;
  const int64_t items = int64_t(w.groups) * cpg * ((M + kTile - 1) / kTile);
  const int spp = int((sk.per + 3) / 4);
  const int64_t last = w.chunks - (sk.ksplit - 1) * sk.per;  // chunks of the last split (1 .. per)
  const int64_t stages = (sk.ksplit - 1) * spp + (last + 3) / 4;
  CM_CU_CHECK(items * stages < (int64_t(1) << 31), "linear '%s': %lld rows are too many for the prefill kernel",
              w.name.c_str(), (long long)M);
  const TileParams p{w.data.as<const uint4>(), w.scales.as<const uint16_t>(),
                     reinterpret_cast<const __nv_bfloat16*>(x), y, ldx, ldy, int(w.chunks), int(w.N), int(w.K),
                     int(M), out == OutType::BF16 ? 1 : 0, w.groups, rbg, cpg, int(items),
                     kEpilogueFactor * w.scale_2, int(sk.ksplit), int(sk.per), spp, int(stages)};
  // One CTA per SM (255 registers x 256 threads), each looping over items.
  const unsigned ctas = unsigned(std::min<int64_t>(items, ctx.sm_count()));
  launch_kernel(ctx, nvfp4_prefill_kernel, dim3(ctas), dim3(kThreads), kSmem, "nvfp4_prefill_kernel", p);
}

}  // namespace cm::cuda
