// The grouped MoE's prefill on wgmma, with the decode kernels' bits (moe_params.cuh, moe.h).
//
// Per 64-token tile of one expert (the routing kernel's list), the same operations as the decode kernels
// (sm90_nvfp4_moe.cu): for each output, four warp chains over the 64-k chunks kw, kw + 4, ... (four
// m16n8k16 steps each), summed as (w0 + w1) + (w2 + w3), then the shared epilogue (swiglu_h; down: times
// the expert's scale). As in the exact wgmma linears (linear/sm90_exact_wgmma.cuh, which says why the
// bits hold), the weights are wgmma's register A operand in the decode kernels' own fragments and the
// activations its shared-memory B operand in the decode kernels' k positions:
//  - x is copied once per step with each 64-column chunk permuted into those positions (reorder_rows);
//    the gate/up epilogue writes h in that permuted order already, so down reads it as it is;
//  - the tile's rows are gathered by the producer warpgroup with cp.async (16 bytes per copy, into the
//    128B-swizzled tile; rows past the expert's tokens are zeros), the weights come by tensor copies.
// Gate/up: CTA = 64 rows of gate (consumer warpgroup 1) and the same 64 rows of up (warpgroup 2); up
// hands its sums to gate through shared memory for the SwiGLU. Down: 128 rows of w2 (64 per warpgroup).
#include <cuda.h>

#include <algorithm>

#include "backend/cuda/core/kernel_setup.h"
#include "backend/cuda/linear/linear.h"
#include "backend/cuda/linear/sm90_exact_wgmma.cuh"
#include "backend/cuda/linear/sm90_nvfp4.cuh"
#include "backend/cuda/linear/sm90_tma.cuh"
#include "backend/cuda/linear/sm90_wgmma.cuh"
#include "backend/cuda/moe/moe.h"
#include "backend/cuda/moe/moe_params.cuh"

namespace cm::cuda::moe {

namespace {

using namespace sm90;
using exact_wgmma::kToks;
using exact_wgmma::kXTile;
static_assert(kToks == kPfTile, "a routing tile is one wgmma token tile");

constexpr int kStages = 8;
constexpr int kWStage = 8 * 512;  // 8 row blocks of codes (gate/up: 4 gate + 4 up)
constexpr int kSStage = 8 * 64;
constexpr int kXOff = 0;
constexpr int kWOff = kXOff + kStages * kXTile;
constexpr int kSOff = kWOff + kStages * kWStage;
constexpr int kUpOff = kSOff + kStages * kSStage;  // f32 [32][128]: up's sums for gate's SwiGLU
constexpr int kBarOff = kUpOff + 32 * 128 * 4;
constexpr int kBytes = kBarOff + 2 * kStages * 8;
constexpr int kSmem = kBytes + 1024;
static_assert(kSmem <= 227 * 1024, "shared memory per block");

// Position p = 16j + 8h + 2t + i of a 64-column chunk holds column k = 16t + 4j + 2h + i.
__device__ __forceinline__ int permuted_col(int col) {
  const int k = col & 63;
  return (col & ~63) | ((k >> 2 & 3) << 4) | ((k >> 1 & 1) << 3) | ((k >> 4) << 1) | (k & 1);
}

// dst[r][c] = src[r][permuted position c]: 8 positions (one 16-byte unit) per thread.
__global__ void __launch_bounds__(256) reorder_rows_kernel(const uint16_t* __restrict__ src, int rows, int cols,
                                                           uint16_t* __restrict__ dst) {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= int64_t(rows) * (cols / 8)) return;
  const int64_t r = i / (cols / 8);
  const int unit = int(i % (cols / 8)), c = unit / 8, u = unit % 8;
  const uint16_t* s = src + r * cols + c * 64 + 2 * u;
  uint32_t v[4];
#pragma unroll
  for (int t = 0; t < 4; ++t) v[t] = *reinterpret_cast<const uint32_t*>(s + 16 * t);
  *reinterpret_cast<uint4*>(dst + r * cols + c * 64 + 8 * u) = make_uint4(v[0], v[1], v[2], v[3]);
}

__device__ __forceinline__ void cp_async_arrive_noinc(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
}

// kGateUp: wa/sa = w1/s1, wb/sb = w3/s3 (boxes of 4 row blocks), grid (inter/64, tiles), rows from xq
// (the permuted x, gathered by sorted_tok). Down: wa/sa = w2/s2 (boxes of 8), grid (ceil(hidden/128),
// tiles), rows of h.
template <bool kGateUp>
__global__ void __launch_bounds__(384, 1) moe_wgmma_kernel(const __grid_constant__ CUtensorMap wa,
                                                           const __grid_constant__ CUtensorMap sa,
                                                           const __grid_constant__ CUtensorMap wb,
                                                           const __grid_constant__ CUtensorMap sb, const MoeParams p,
                                                           const uint16_t* xq) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = exact_wgmma::align_1024(smem_raw);
  const uint32_t sbase = smem_u32(smem);
  const uint32_t full0 = sbase + kBarOff, empty0 = full0 + kStages * 8;
  const int wg = threadIdx.x / 128, lane = threadIdx.x & 31;
  if (threadIdx.x == 0) {
    for (int i = 0; i < kStages; ++i) {
      mbar_init(full0 + 8 * i, 1 + 128);  // the tensor copies' arrival + each producer thread's cp.async
      mbar_init(empty0 + 8 * i, 8);
    }
    mbar_init_fence();
  }
  __syncthreads();
  asm volatile("griddepcontrol.wait;" ::: "memory");
  const int tile = blockIdx.y;
  if (tile >= p.tiles[0]) return;
  const int e = p.tiles[1 + 2 * tile], n0 = p.tiles[2 + 2 * tile];
  const int off = p.offsets[e] + n0, cnt = min(p.offsets[e + 1] - off, kToks);
  const int ch = kGateUp ? p.ch13 : p.ch2;
  const int nrb = (kGateUp ? p.inter : p.hidden) / 16;  // row blocks per expert
  const int rb0 = kGateUp ? blockIdx.x * 4 : blockIdx.x * 8;

  if (wg == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 56;");
    const int tid = threadIdx.x;
    // This thread's 4 of the tile's 512 16-byte units: rows tid/8 + 16j, unit tid % 8.
    const int u = tid & 7;
    const uint16_t* src[4];
    bool ok[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int r = (tid >> 3) + 16 * j;
      ok[j] = r < cnt;
      const int64_t row = !ok[j] ? 0 : kGateUp ? p.sorted_tok[off + r] / p.topk : off + r;
      src[j] = (kGateUp ? xq : reinterpret_cast<const uint16_t*>(p.h)) +
               row * (kGateUp ? p.hidden : p.inter) + 8 * u;
    }
    const int row0 = e * nrb + rb0;  // tensor-map row of the tile's first row block
    for (int c = 0; c < ch; ++c) {
      const int st = c % kStages;
      const uint32_t full = full0 + 8 * st;
      mbar_wait(empty0 + 8 * st, (uint32_t(c / kStages) & 1u) ^ 1u);
      if (tid == 0) {
        mbar_expect_tx(full, kWStage + kSStage);
        if constexpr (kGateUp) {
          tma_load_2d(sbase + kWOff + st * kWStage, &wa, c * 128, row0, full);
          tma_load_2d(sbase + kWOff + st * kWStage + 4 * 512, &wb, c * 128, row0, full);
          tma_load_2d(sbase + kSOff + st * kSStage, &sa, c * 16, row0, full);
          tma_load_2d(sbase + kSOff + st * kSStage + 4 * 64, &sb, c * 16, row0, full);
        } else {
          tma_load_2d(sbase + kWOff + st * kWStage, &wa, c * 128, row0, full);
          tma_load_2d(sbase + kSOff + st * kSStage, &sa, c * 16, row0, full);
        }
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int r = (tid >> 3) + 16 * j;
        cp_async16(sbase + kXOff + st * kXTile + sw128_offset(r, 8 * u), ok[j] ? src[j] + c * 64 : src[j],
                   ok[j] ? 16 : 0);
      }
      cp_async_arrive_noinc(full);
    }
    asm volatile("cp.async.wait_all;" ::: "memory");
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 224;");
  const int cw = wg - 1, w4 = (threadIdx.x >> 5) & 3, g = lane >> 2, t = lane & 3;
  const int rb = 4 * cw + w4;  // this warp's row block in the stage (gate/up: 0-3 gate, 4-7 up)
  const bool present = rb0 + (kGateUp ? w4 : rb) < nrb;  // gate/up tiles are always whole (inter % 64 == 0)
  float acc[4][32];
  uint32_t af[2][4][4] = {};
#pragma unroll
  for (int kw = 0; kw < 4; ++kw)
#pragma unroll
    for (int i = 0; i < 32; ++i) acc[kw][i] = 0.f;
  int prev_st = -1;
  for (int c0 = 0; c0 < ch; c0 += 4) {
#pragma unroll
    for (int kw = 0; kw < 4; ++kw) {
      const int c = c0 + kw;
      if (c >= ch) break;
      const int st = c % kStages;
      mbar_wait(full0 + 8 * st, uint32_t(c / kStages) & 1u);
      // The gathered rows were written by cp.async (generic proxy); wgmma reads through the async proxy.
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
      uint32_t(&a)[4][4] = af[kw & 1];
      if (present) {
        const uint4 wv = *reinterpret_cast<const uint4*>(smem + kWOff + st * kWStage + rb * 512 + lane * 16);
        const uint32_t sv = *reinterpret_cast<const uint16_t*>(smem + kSOff + st * kSStage + rb * 64 + lane * 2);
        uint32_t sg, sg8;
        decode_scales(sv, sg, sg8);
        expand_word(wv.x, sg, sg8, a[0]);
        expand_word(wv.y, sg, sg8, a[1]);
        expand_word(wv.z, sg, sg8, a[2]);
        expand_word(wv.w, sg, sg8, a[3]);
      }
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
  float v[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) v[i] = exact_wgmma::chains_sum(acc, i);
  // Fragment element i = 4q + f: row g (f < 2) or g + 8 of the warp's 16, token 8q + 2t + (f & 1).
  if constexpr (kGateUp) {
    float* up = reinterpret_cast<float*>(smem + kUpOff) + (threadIdx.x & 127);
    if (cw == 1) {
#pragma unroll
      for (int i = 0; i < 32; ++i) up[i * 128] = v[i];
    }
    named_barrier(1, 256);
    if (cw == 1) return;
    const float sc_g = kEpilogueFactor * p.scale2[e * 3], sc_u = kEpilogueFactor * p.scale2[e * 3 + 1];
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      const int n = 8 * (i >> 2) + 2 * t + (i & 1);
      if (n >= cnt) continue;
      const int col = (rb0 + w4) * 16 + g + 8 * ((i >> 1) & 1);
      const float hv = swiglu_h(v[i], up[i * 128], sc_g, sc_u, p.limit, p.sorted_w[off + n]);
      p.h[int64_t(off + n) * p.inter + permuted_col(col)] = __float2bfloat16_rn(hv);
    }
  } else {
    if (!present) return;
    const float sc = kEpilogueFactor * p.scale2[e * 3 + 2];
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      const int n = 8 * (i >> 2) + 2 * t + (i & 1);
      if (n >= cnt) continue;
      const int row = (rb0 + rb) * 16 + g + 8 * ((i >> 1) & 1);
      p.yk[int64_t(p.sorted_tok[off + n]) * p.hidden + row] = v[i] * sc;
    }
  }
}

}  // namespace

void setup_moe_wgmma_kernels() {
  CM_CUDA(cudaFuncSetAttribute(moe_wgmma_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  CM_CUDA(cudaFuncSetAttribute(moe_wgmma_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
}

const char* wgmma_unsupported(const DeviceExperts& e) {
  if (e.hidden % 64 != 0 || e.inter % 64 != 0) return "hidden and intermediate must be multiples of 64";
  return nullptr;
}

void prefill_wgmma(Context& ctx, const DeviceExperts& e, MoeScratch& s, const MoeParams& p, unsigned tiles) {
  const char* why = wgmma_unsupported(e);
  CM_CU_CHECK(why == nullptr, "moe: the wgmma prefill does not take these experts: %s", why ? why : "");
  auto map = [&](const DeviceBuffer& b, int64_t rows, int64_t chunks, int64_t unit_bytes, uint32_t box_rows) {
    return encode_tensor_map_2d(CU_TENSOR_MAP_DATA_TYPE_UINT32, b.get(), uint64_t(chunks * unit_bytes / 4),
                                uint64_t(rows), uint64_t(chunks * unit_bytes), uint32_t(unit_bytes / 4), box_rows,
                                CU_TENSOR_MAP_SWIZZLE_NONE, "routed experts");
  };
  const int64_t rb13 = int64_t(e.count) * (e.inter / 16), rb2 = int64_t(e.count) * (e.hidden / 16);
  const CUtensorMap w1 = map(e.w1, rb13, p.ch13, 512, 4), s1 = map(e.s1, rb13, p.ch13, 64, 4);
  const CUtensorMap w3 = map(e.w3, rb13, p.ch13, 512, 4), s3 = map(e.s3, rb13, p.ch13, 64, 4);
  const CUtensorMap w2 = map(e.w2, rb2, p.ch2, 512, 8), s2 = map(e.s2, rb2, p.ch2, 64, 8);
  uint16_t* xq = s.xq.as<uint16_t>();
  const int64_t units = int64_t(p.T) * (e.hidden / 8);
  launch_kernel(ctx, reorder_rows_kernel, dim3(unsigned((units + 255) / 256)), dim3(256), 0, "moe_reorder_x_kernel",
                reinterpret_cast<const uint16_t*>(p.x), p.T, p.hidden, xq);
  launch_kernel(ctx, moe_wgmma_kernel<true>, dim3(unsigned(e.inter / 64), tiles), dim3(384), kSmem,
                "moe_wgmma_gate_up_kernel", w1, s1, w3, s3, p, static_cast<const uint16_t*>(xq));
  launch_kernel(ctx, moe_wgmma_kernel<false>, dim3(unsigned((e.hidden + 127) / 128), tiles), dim3(384), kSmem,
                "moe_wgmma_down_kernel", w2, s2, w2, s2, p, static_cast<const uint16_t*>(xq));
}

}  // namespace cm::cuda::moe
