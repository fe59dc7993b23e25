// FP8 128x128-block linear, prefill kernel (see linear.h).
//
// At prefill (M in the thousands) the decode kernel (sm90_fp8_linear.cu) runs
// on 32-token slices and re-reads and re-expands every weight chunk once per
// slice. This kernel's work item is a 64-token tile x 64 rows (4 row blocks),
// done by one CTA of 8 warps (2 row groups x 4 K warps, each warp two 16-row
// blocks). Four K chunks of the tile's activations and each warp's own weight
// chunks are staged in shared memory by cp.async, four stages in flight, so
// each weight word is loaded and expanded once per 64 tokens and each
// activation read from L2 once per 64 rows. (The MoE prefill kernel,
// sm90_nvfp4_moe.cu, is the same structure for NVFP4.) The grid is one CTA
// per SM, each working through its items with the pipeline running on from
// one item into the next (no exposed pipeline fill per item: wq_b's K = 1024
// is only 4 stages). Registers: a warp holds 64 accumulators and its 32
// expanded A operands; ptxas uses ~220-240 registers, so 8 warps per SM (12
// warps, capped at 168 registers, spill).
//
// Bit identity with the decode kernel, per output (the engine needs a token's
// logits not to depend on how many rows share the step or how the prompt was
// chunked):
//  - the same K split: ksplit and chunks per split are the decode kernel's
//    for this weight (fp8_chunks_per_split, one value at every M);
//  - within a split, warp kw walks chunks c_begin + kw, + 4, ... in order, and
//    each chunk is a zeroed fp32 tile, mma steps j = 0..3 on the same A (the
//    lane's expanded weight words) and B (the lane's 16 activations, in
//    fp8_step_b0/b1's order) fragments, then acc = fma(tile, scale, acc), as
//    fp8_chunk_mma;
//  - the four warps' sums meet in reduce_warps_group's (w0 + w1) + (w2 + w3);
//  - the splits' sums are added in split order starting from 0.f, as
//    splitk_combine's last arriver does (with one split: the value itself);
//  - the same store (store_tile_group, factor 1).
// An mma output element depends only on its own row of A and column of B, so
// a token's result does not depend on the other tokens of its tile. Where the
// decode kernel splits K across CTAs, this kernel runs the splits one after
// the other in the same CTA (the split's warp sums are reduced in shared
// memory at its last stage) and keeps the running sum in registers.
#include <cuda_bf16.h>

#include <algorithm>

#include "backend/cuda/linear/linear.h"
#include "backend/cuda/core/kernel_setup.h"
#include "backend/cuda/core/ops_device.cuh"
#include "backend/cuda/linear/sm90_fp8.cuh"
#include "backend/cuda/linear/sm90_splitk.cuh"

namespace cm::cuda {

namespace {

constexpr int kMT = 8;                               // token groups of 8 per warp
constexpr int kTile = 8 * kMT;                       // tokens per CTA
constexpr int kNA = 2;                               // 16-row blocks per warp
constexpr int kRG = 2;                               // row groups (4 K warps each) per CTA
constexpr int kRowBlocks = kRG * kNA;                // 16-row blocks per CTA
constexpr int kWarps = 4 * kRG;
constexpr int kThreads = 32 * kWarps;
constexpr int kPitch = 72;                           // bf16 per staged token row (64 + 8: conflict-free 16-byte reads)
constexpr int kXBytes = 4 * kTile * kPitch * 2;      // a stage's activations: 4 chunks of the tile
constexpr int kWBytes = kWarps * kNA * 1024;         // each warp's chunk of its row blocks
constexpr int kBufBytes = kXBytes + kWBytes;
constexpr int kBufs = 4;                             // stages in flight
constexpr size_t kSmem = size_t(kBufs) * kBufBytes;
constexpr int kRedFloats = 4 * kTile * 16;           // one row group's reduce area
static_assert(kRG * kRedFloats * 4 <= kBufBytes, "the reduce area reuses a stage buffer");
static_assert(kBufBytes % 16 == 0 && kXBytes % 16 == 0, "16-byte cp.async alignment");

struct Fp8PrefillParams : Fp8Args {
  int rbs_per_group;   // row blocks of one group (all of them for groups = 1)
  int ctas_per_group;  // 64-row blocks of CTA work along N per group
  int tiles;           // 64-token tiles
  int items;           // tiles x 64-row blocks of all groups: the work items
  int ksplit, chunks_per_split;
  int stages_per_split;  // stages of 4 chunks in a full split
  int stages;            // in all splits: stages per item
};

// 16-byte global -> shared copy (L2 only); src_bytes 0 fills the 16 bytes with zeros.
__device__ __forceinline__ void cp_async16(uint32_t d, const void* src, int src_bytes) {
  const size_t g = __cvta_generic_to_global(src);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(g), "r"(src_bytes) : "memory");
}

// A lane's 16 staged activations (two 16-byte shared loads at addr, addr + 16).
__device__ __forceinline__ void lds128x2(uint32_t addr, uint4 (&v)[2]) {
  asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%8];\n\tld.shared.v4.u32 {%4,%5,%6,%7}, [%8+16];"
               : "=r"(v[0].x), "=r"(v[0].y), "=r"(v[0].z), "=r"(v[0].w), "=r"(v[1].x), "=r"(v[1].y), "=r"(v[1].z),
                 "=r"(v[1].w)
               : "r"(addr)
               : "memory");
}

// Stage st's split and its chunk range: chunks c0 .. c0+3 of split sp (< c_end).
struct StageChunks {
  int c0, c_end;
  bool last;  // the split's last stage
};
__device__ __forceinline__ StageChunks stage_chunks(const Fp8PrefillParams& p, int st) {
  const int sp = st / p.stages_per_split, q = st % p.stages_per_split;
  const int cb = sp * p.chunks_per_split;
  const int ce = min(int(p.chunks), cb + p.chunks_per_split);
  return StageChunks{cb + 4 * q, ce, cb + 4 * (q + 1) >= ce};
}

// One chunk of one row block against the tile's 8 token groups: per token
// group a zeroed tile, the 4 mma steps in order, one fma with the scale (the
// sequence fp8_chunk_mma runs per output).
__device__ __forceinline__ void chunk_tile_mma(const uint32_t (&a)[4][4], const uint4 (&xv)[2], float scale,
                                               float (&acc)[4]) {
  float tmp[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int j = 0; j < 4; ++j) sm90::mma_16816(tmp, a[j], sm90::fp8_step_b0(xv, j), sm90::fp8_step_b1(xv, j));
#pragma unroll
  for (int i = 0; i < 4; ++i) acc[i] = fmaf(tmp[i], scale, acc[i]);
}

// A work item: 64-token tile `tile`, row blocks [rb_base, rb_base + kRowBlocks)
// (those < rb_end) of group grp. Items are numbered tile-fastest, so the CTAs
// working at the same time share weight rows (read from L2 once for all).
struct Item {
  int m0, rows;  // first token, tokens present (<= kTile)
  int grp, rb_base, rb_end;
};
__device__ __forceinline__ Item item_at(const Fp8PrefillParams& p, int idx) {
  const int tile = idx % p.tiles, cn = idx / p.tiles;
  Item it;
  it.m0 = tile * kTile;
  it.rows = min(kTile, p.M - it.m0);
  it.grp = cn / p.ctas_per_group;
  it.rb_base = it.grp * p.rbs_per_group + (cn % p.ctas_per_group) * kRowBlocks;
  it.rb_end = min((it.grp + 1) * p.rbs_per_group, p.row_blocks);
  return it;
}

// Persistent: CTA b works on items b, b + gridDim.x, ... one after the other,
// and the cp.async pipeline runs on across items (stage st is stage
// st % p.stages of the CTA's item st / p.stages), so the next item's first
// loads overlap this item's last chunks and its epilogue.
// SPLIT: ksplit > 1 (running sum over the splits).
template <bool SPLIT>
__global__ void __launch_bounds__(kThreads, 1) fp8_prefill_kernel(const Fp8PrefillParams p) {
  using namespace sm90;
  extern __shared__ __align__(16) unsigned char pf_smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int kw = warp & 3, r = warp >> 2, tid = threadIdx.x & 127;
  const int n_items = blockIdx.x < p.items ? (p.items - 1 - int(blockIdx.x)) / int(gridDim.x) + 1 : 0;
  const int total = n_items * p.stages;
  dev::pdl_wait_and_release();  // x is the previous kernel's output
  const uint32_t sm0 = uint32_t(__cvta_generic_to_shared(pf_smem));
  const uint32_t wdst = sm0 + uint32_t(kXBytes + (warp * kNA * 64 + lane) * 16);
  // Stage st into buffer st % kBufs: the item's activations of the stage's 4
  // chunks (zeros for absent tokens, chunks past the split and k past K, as
  // the decode kernel's loads) and each warp's weight chunk c0 + kw of its
  // two row blocks (zeros past the item's rows).
  auto stage = [&](int st) {
    if (st < total) {
      const Item it = item_at(p, int(blockIdx.x) + (st / p.stages) * int(gridDim.x));
      const StageChunks sc = stage_chunks(p, st % p.stages);
      const uint32_t bo = uint32_t((st % kBufs) * kBufBytes);
      const __nv_bfloat16* const xsrc = p.x + int64_t(it.m0) * p.ldx + int64_t(it.grp) * p.K;
      for (int i = threadIdx.x; i < 4 * kTile * 8; i += kThreads) {
        const int q = i / (kTile * 8), row = (i / 8) % kTile, piece = i % 8;
        const int c = sc.c0 + q, k = c * 64 + 8 * piece;
        const bool ok = row < it.rows && c < sc.c_end && k < p.K;
        cp_async16(sm0 + bo + uint32_t(((q * kTile + row) * kPitch + 8 * piece) * 2),
                   ok ? xsrc + int64_t(row) * p.ldx + k : p.x, ok ? 16 : 0);
      }
      const int c = sc.c0 + kw;
#pragma unroll
      for (int a = 0; a < kNA; ++a) {
        const int rb = it.rb_base + kNA * r + a;
        const bool ok = c < sc.c_end && rb < it.rb_end;
        const uint4* const src = p.w + (int64_t(ok ? rb : 0) * p.chunks + (ok ? c : 0)) * 64 + lane;
#pragma unroll
        for (int h = 0; h < 2; ++h) cp_async16(wdst + bo + uint32_t((a * 64 + 32 * h) * 16), src + 32 * h, ok ? 16 : 0);
      }
    }
    asm volatile("cp.async.commit_group;" ::: "memory");  // empty past the end: the wait count stays uniform
  };

  float acc[kNA][kMT][4];
  float run[kNA][SPLIT ? kMT : 1];  // SPLIT: the sum of the item's finished splits
#pragma unroll
  for (int a = 0; a < kNA; ++a) {
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) acc[a][mt][0] = acc[a][mt][1] = acc[a][mt][2] = acc[a][mt][3] = 0.f;
#pragma unroll
    for (int q = 0; q < (SPLIT ? kMT : 1); ++q) run[a][q] = 0.f;
  }
#pragma unroll
  for (int st = 0; st < kBufs - 1; ++st) stage(st);
  for (int st = 0; st < total; ++st) {
    stage(st + kBufs - 1);  // into the buffer computed at st - 1 (released by its closing barrier)
    asm volatile("cp.async.wait_group %0;" ::"n"(kBufs - 1) : "memory");
    __syncthreads();
    const Item it = item_at(p, int(blockIdx.x) + (st / p.stages) * int(gridDim.x));
    const int rb0 = it.rb_base + kNA * r;  // this warp's row blocks rb0, rb0 + 1
    const StageChunks sc = stage_chunks(p, st % p.stages);
    const int c = sc.c0 + kw;
    if (c < sc.c_end) {
      float scale[kNA];
      uint32_t af[kNA][4][4];
#pragma unroll
      for (int a = 0; a < kNA; ++a) {
        const int rb = rb0 + a < it.rb_end ? rb0 + a : 0;
        scale[a] = __ldg(p.s + int64_t(rb / 8) * p.scale_cols + (c >> 1));
        const uint4* const ws =
            reinterpret_cast<const uint4*>(pf_smem + (st % kBufs) * kBufBytes + kXBytes) + (warp * kNA + a) * 64 + lane;
        const uint4 w0 = ws[0], w1 = ws[32];
#pragma unroll
        for (int j = 0; j < 4; ++j) fp8_step_a(w0, w1, j, af[a][j]);
      }
      // Token group mt's activations are loaded while group mt - 1 is multiplied.
      const uint32_t xt = sm0 + uint32_t((st % kBufs) * kBufBytes + ((kw * kTile + g) * kPitch + 16 * t) * 2);
      uint4 xv[2][2];
      lds128x2(xt, xv[0]);
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        if (mt + 1 < kMT) lds128x2(xt + uint32_t(8 * (mt + 1) * kPitch * 2), xv[(mt + 1) & 1]);
#pragma unroll
        for (int a = 0; a < kNA; ++a) chunk_tile_mma(af[a], xv[mt & 1], scale[a], acc[a][mt]);
      }
    }
    __syncthreads();  // this buffer is staged again at st + 1
    if (!sc.last) continue;
    // The split's value (the decode kernel's partial tile), reduced in this
    // stage's buffer (free until stage st + kBufs is issued at st + 1); with
    // several splits added to the running sum in split order.
    float* const red = reinterpret_cast<float*>(pf_smem + (st % kBufs) * kBufBytes) + r * kRedFloats;
    float vals[kNA][kMT];
#pragma unroll
    for (int a = 0; a < kNA; ++a) {
      reduce_warps_group<kMT>(acc[a], red, kw, tid, vals[a]);
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) acc[a][mt][0] = acc[a][mt][1] = acc[a][mt][2] = acc[a][mt][3] = 0.f;
    }
    if constexpr (SPLIT) {
      const bool item_done = st % p.stages == p.stages - 1;
#pragma unroll
      for (int a = 0; a < kNA; ++a)
#pragma unroll
        for (int q = 0; q < kMT; ++q) {
          run[a][q] += vals[a][q];
          vals[a][q] = run[a][q];
          if (item_done) run[a][q] = 0.f;
        }
      if (!item_done) continue;
    }
    const size_t esize = p.y_bf16 ? 2 : 4;
    void* const yt = static_cast<char*>(p.y) + size_t(int64_t(it.m0) * p.ldy) * esize;
#pragma unroll
    for (int a = 0; a < kNA; ++a)
      if (rb0 + a < it.rb_end) store_tile_group<kMT>(vals[a], tid, rb0 + a, it.rows, p.N, yt, p.ldy, p.y_bf16 != 0, 1.0f);
  }
  asm volatile("cp.async.wait_group 0;" ::: "memory");  // only empty groups remain
}

}  // namespace

void setup_fp8_prefill_kernels() {
  CM_CUDA(cudaFuncSetAttribute(fp8_prefill_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmem)));
  CM_CUDA(cudaFuncSetAttribute(fp8_prefill_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmem)));
}

void linear_fp8_prefill(Context& ctx, const DeviceFp8Linear& w, const uint16_t* x, int64_t M, int64_t ldx, void* y,
                        int64_t ldy, OutType out) {
  CM_CU_CHECK(ldx >= w.groups * w.K && ldy >= w.N, "linear '%s': leading dimensions too small", w.name.c_str());
  CM_CU_CHECK((ldx % 8) == 0 && (reinterpret_cast<uintptr_t>(x) % 16) == 0,
              "linear '%s': activations must be 16-byte aligned rows", w.name.c_str());
  if (M <= 0) return;
  const int64_t tiles = (M + kTile - 1) / kTile;
  const int64_t rbs_per_group = w.row_blocks / w.groups;  // whole row blocks per group (check_upload_shape)
  const int64_t ctas_per_group = (rbs_per_group + kRowBlocks - 1) / kRowBlocks;
  const int64_t items = tiles * ctas_per_group * w.groups;
  CM_CU_CHECK(items < (int64_t(1) << 31) && M < (int64_t(1) << 31),
              "linear '%s': %lld rows x %lld outputs exceed the prefill kernel's work index", w.name.c_str(),
              (long long)M, (long long)w.N);
  Fp8PrefillParams p{};
  static_cast<Fp8Args&>(p) = fp8_args(w, x, M, ldx, y, ldy, out);
  p.rbs_per_group = int(rbs_per_group);
  p.ctas_per_group = int(ctas_per_group);
  p.tiles = int(tiles);
  p.items = int(items);
  const int64_t per = fp8_chunks_per_split(ctx, w);
  const int64_t ksplit = (w.chunks + per - 1) / per;
  p.ksplit = int(ksplit);
  p.chunks_per_split = int(per);
  p.stages_per_split = int((per + 3) / 4);
  p.stages = int((ksplit - 1) * p.stages_per_split + (w.chunks - (ksplit - 1) * per + 3) / 4);
  // One CTA per SM (kSmem), each working through its share of the items.
  const dim3 grid(unsigned(std::min<int64_t>(items, ctx.sm_count())));
  if (ksplit > 1)
    launch_kernel(ctx, fp8_prefill_kernel<true>, grid, dim3(kThreads), kSmem, "fp8_prefill_kernel", p);
  else
    launch_kernel(ctx, fp8_prefill_kernel<false>, grid, dim3(kThreads), kSmem, "fp8_prefill_kernel", p);
}

}  // namespace cm::cuda
