// Grouped NVFP4 MoE kernels, decode and prefill (see cuda_moe.h).
//
// route:   one CTA counts tokens per local expert, scans the counts into
//          offsets and a compact list of active experts, and lists the
//          (token·topk + k, weight) pairs in expert-major order, each
//          expert's in token order (thread e scans the ids in order: the
//          same routing always gives the same lists). Everything stays on
//          the device.
// gate_up: grid (inter/16 row blocks, max active experts). A CTA whose slot
//          is beyond the active count exits; otherwise its 4 warps split K and
//          stream the gate and up rows of one 16-row block together, so the
//          clamped SwiGLU and the routing weight are applied in the epilogue
//          and h (bf16, expert-major) is written once.
// down:    grid (hidden/16 row blocks, max active experts); reads h rows of
//          its expert's tokens and stores each (token, k) result in its own
//          f32 row of the scratch yk [T·topk, hidden] (no atomics).
// combine: y[t] = Σ_k yk[t·topk + k] over the k with a local expert, in k
//          order: the same step gives the same bits.
// Token groups of 16 per pass; an expert with more tokens loops (weights are
// then re-read from L2).
//
// prefill: at 2048+ tokens every expert holds tens of tokens and the decode
//          kernels re-read (and re-expand) each weight chunk once per 16
//          tokens. The prefill kernels take a 64-token tile of one expert
//          (the route kernel lists the tiles) and 4 row blocks per CTA (16
//          warps). Four K chunks of the tile's activations and each warp's
//          weight chunk are staged in shared memory by cp.async, three stages
//          in flight, so each weight word is loaded and expanded once per 64
//          tokens and each activation read from L2 once per 64 rows.
//          Bit identity with the decode kernels (the engine needs a token's
//          logits not to depend on how the prompt was chunked): warp kw of a
//          row block walks the chunks kw, kw+4, ... in increasing order with
//          the same 4 mma steps per chunk on the same A fragments, exactly the
//          K split of the decode kernels' warps, and the four partial sums
//          meet in reduce_warps_group's fixed order; the epilogue math is one
//          non-inlined function both paths call. An mma output element
//          depends only on its own row of A and column of B (the decode
//          kernels already rely on this: a token's column changes with the
//          batch), so a token gets the same bits from either path.
#include <cuda_bf16.h>

#include <algorithm>

#include "backend/cuda/linear/linear.h"
#include "backend/cuda/moe/moe.h"
#include "backend/cuda/moe/moe_params.cuh"
#include "backend/cuda/core/kernel_setup.h"
#include "backend/cuda/linear/nvfp4_pack.h"
#include "backend/cuda/core/ops_device.cuh"
#include "backend/cuda/linear/sm90_nvfp4.cuh"

namespace cm::cuda {

namespace {

using moe::kPfTile;
using moe::MoeParams;
using moe::swiglu_h;


// Prefill tiling (see the top of the file).
constexpr int kPfMT = 8;                          // 8 groups of 8 tokens per tile
static_assert(kPfTile == 8 * kPfMT, "tokens per tile");
constexpr int kPfRB = 4;                          // warp groups per CTA (one or two 16-row blocks each)
constexpr int kPfWarps = 4 * kPfRB;               // 4 K-split warps per group
constexpr int kPfThreads = 32 * kPfWarps;
constexpr int kPfPitch = 72;                      // bf16 per staged token row (64 + 8: conflict-free 16-byte reads)
constexpr int kPfXBytes = 4 * kPfTile * kPfPitch * 2;  // a stage's activations: 4 chunks of the tile
constexpr int kPfWBytes = kPfWarps * 2 * 512;     // each warp's chunk of its 2 weight fragments
constexpr int kPfSBytes = kPfWarps * 2 * 64;      // and their scales
constexpr int kPfBufBytes = kPfXBytes + kPfWBytes + kPfSBytes;
constexpr int kPfBufs = 3;                        // stages in flight
constexpr size_t kPfSmem = size_t(kPfBufs) * kPfBufBytes;
static_assert(kPfSmem >= size_t(kPfRB) * 4 * kPfTile * 16 * 4, "the reduce area reuses the stage buffers");
static_assert(kPfBufBytes % 16 == 0 && kPfXBytes % 16 == 0, "16-byte cp.async alignment");


__global__ void __launch_bounds__(1024) moe_route_kernel(const MoeParams p) {
  // PDL: wait for the kernel that produced ids/weights (and for the previous
  // MoE's down kernel, which read these lists), then let gate/up's CTAs
  // become resident while the routing runs.
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;");
  __shared__ int cnt[1024];
  __shared__ int tmp[33];
  const int e = threadIdx.x;
  if (e < p.count) cnt[e] = 0;
  __syncthreads();
  const int n = p.T * p.topk;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const int le = p.ids[i] - p.first;
    if (le >= 0 && le < p.count) atomicAdd(&cnt[le], 1);
  }
  __syncthreads();
  const int c = e < p.count ? cnt[e] : 0;
  int total = 0, nact = 0;
  const int off = dev::block_excl_scan(c, tmp, total);
  const int aoff = dev::block_excl_scan(c > 0 ? 1 : 0, tmp, nact);
  if (e < p.count) {
    p.offsets[e] = off;
    if (c > 0) p.active[aoff] = e;
  }
  if (threadIdx.x == 0) {
    p.offsets[p.count] = total;
    p.offsets[p.count + 1] = nact;
  }
  __syncthreads();
  if (p.tiles != nullptr) {  // prefill: this expert's 64-token tiles, expert-major
    const int nt = (c + kPfTile - 1) / kPfTile;
    int ntiles = 0;
    const int toff = dev::block_excl_scan(nt, tmp, ntiles);
    for (int j = 0; j < nt; ++j) {
      p.tiles[1 + 2 * (toff + j)] = e;
      p.tiles[2 + 2 * (toff + j)] = j * kPfTile;
    }
    if (threadIdx.x == 0) p.tiles[0] = ntiles;
  }
  if (e < p.count && c > 0) {  // this expert's slots in (token, k) order
    int pos = off;
    for (int i = 0; i < n; ++i)
      if (p.ids[i] - p.first == e) {
        p.sorted_tok[pos] = i;
        p.sorted_w[pos] = p.weights[i];
        ++pos;
      }
  }
}

// kMT: 8*kMT tokens per pass (1 when no expert can have more than 8 tokens).
template <int kMT>
__global__ void __launch_bounds__(128) moe_gate_up_kernel(const MoeParams p) {
  constexpr int U = 2;
  using namespace sm90;
  // PDL: this grid may start while the routing kernel runs; wait for it, then
  // let the down kernel launch into the SM slots this grid leaves free.
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;");
  const int slot = blockIdx.y;
  if (slot >= p.offsets[p.count + 1]) return;
  const int e = p.active[slot];
  const int off = p.offsets[e], cnt = p.offsets[e + 1] - off;
  const int rb = blockIdx.x;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int64_t wo = int64_t(e) * p.stride13 + int64_t(rb) * p.ch13 * 32;
  if (threadIdx.x == 0) {  // the whole gate and up row block into L2 at once: a deeper memory pipeline
    const uint32_t db = uint32_t(p.ch13 * 512), sbytes = uint32_t(p.ch13 * 64);
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p.w1 + wo), "r"(db) : "memory");
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p.w3 + wo), "r"(db) : "memory");
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p.s1 + wo), "r"(sbytes) : "memory");
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p.s3 + wo), "r"(sbytes) : "memory");
  }
  const uint4* const wb[2] = {p.w1 + wo + lane, p.w3 + wo + lane};
  const uint16_t* const sb[2] = {p.s1 + wo + g * 4 + t, p.s3 + wo + g * 4 + t};
  const float sc_g = kEpilogueFactor * p.scale2[e * 3], sc_u = kEpilogueFactor * p.scale2[e * 3 + 1];
  __shared__ float red[4 * 8 * kMT * 16];
  for (int g0 = 0; g0 < cnt; g0 += 8 * kMT) {
    const __nv_bfloat16* xrow[kMT];
    bool xok[kMT];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
      const int n = g0 + g + 8 * mt;
      xok[mt] = n < cnt;
      xrow[mt] = p.x + int64_t(xok[mt] ? p.sorted_tok[off + n] / p.topk : 0) * p.hidden + 16 * t;
    }
    float acc[2][kMT][4] = {};
    warp_kloop<kMT, U, 2, false>(wb, sb, xrow, xok, warp, p.ch13, 4, p.hidden, t, acc);
    float gv[kMT], uv[kMT];
    reduce_warps<kMT>(acc[0], red, gv);
    reduce_warps<kMT>(acc[1], red, uv);
#pragma unroll
    for (int q = 0; q < kMT; ++q) {
      const int v = threadIdx.x + 128 * q;
      const int n = g0 + v / 16;
      if (n < cnt) {
        const float hv = swiglu_h(gv[q], uv[q], sc_g, sc_u, p.limit, p.sorted_w[off + n]);
        p.h[int64_t(off + n) * p.inter + rb * 16 + v % 16] = __float2bfloat16_rn(hv);
      }
    }
  }
}

template <int kMT>
__global__ void __launch_bounds__(128) moe_down_kernel(const MoeParams p) {
  constexpr int U = 4;
  using namespace sm90;
  // PDL: this grid starts while gate/up still runs (after every gate/up CTA
  // passed its own wait, so the routing lists are complete and visible in L2:
  // read them with ld.cg). Pull this CTA's down weights into L2 meanwhile, and
  // wait for gate/up (h, the zeroed y) before the k loop.
  const int slot = blockIdx.y;
  if (slot >= __ldcg(p.offsets + p.count + 1)) {
    asm volatile("griddepcontrol.wait;" ::: "memory");  // every PDL grid waits before it exits
    return;
  }
  const int e = __ldcg(p.active + slot);
  const int rb = blockIdx.x;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int64_t wo = int64_t(e) * p.stride2 + int64_t(rb) * p.ch2 * 32;
  if (threadIdx.x == 0) {
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p.w2 + wo), "r"(uint32_t(p.ch2 * 512)) : "memory");
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p.s2 + wo), "r"(uint32_t(p.ch2 * 64)) : "memory");
  }
  asm volatile("griddepcontrol.wait;" ::: "memory");
  // gate/up is complete: let the combine kernel launch into the free slots.
  asm volatile("griddepcontrol.launch_dependents;");
  const int off = __ldcg(p.offsets + e), cnt = __ldcg(p.offsets + e + 1) - off;
  const uint4* const wb[1] = {p.w2 + wo + lane};
  const uint16_t* const sb[1] = {p.s2 + wo + g * 4 + t};
  const float sc = kEpilogueFactor * p.scale2[e * 3 + 2];
  __shared__ float red[4 * 8 * kMT * 16];
  for (int g0 = 0; g0 < cnt; g0 += 8 * kMT) {
    const __nv_bfloat16* xrow[kMT];
    bool xok[kMT];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
      const int n = g0 + g + 8 * mt;
      xok[mt] = n < cnt;
      xrow[mt] = p.h + int64_t(off + (xok[mt] ? n : 0)) * p.inter + 16 * t;
    }
    float acc[1][kMT][4] = {};
    warp_kloop<kMT, U, 1, false>(wb, sb, xrow, xok, warp, p.ch2, 4, p.inter, t, acc);
    float vals[kMT];
    reduce_warps<kMT>(acc[0], red, vals);
#pragma unroll
    for (int q = 0; q < kMT; ++q) {
      const int v = threadIdx.x + 128 * q;
      const int n = g0 + v / 16;
      if (n < cnt) p.yk[int64_t(p.sorted_tok[off + n]) * p.hidden + rb * 16 + v % 16] = vals[q] * sc;
    }
  }
}

// Prefill gate/up + SwiGLU (kGateUp) or down for one 64-token tile of one
// expert. Each warp multiplies two weight fragments (A) by every token
// fragment (B) it reads from shared memory: gate/up the gate and up rows of
// one row block, down two row blocks of w2 (two mma per 16-byte activation
// read either way; one would make shared memory the bottleneck). Warp
// (r, kw) walks chunks kw, kw+4, ... (the decode kernels' K split; see the
// top of the file); a CTA covers kPfRB row blocks (gate/up) or 2*kPfRB
// (down). grid (row-block groups, max tiles); CTAs past the tile count exit.
// Stage s holds chunks 4s .. 4s+3: the tile's activations of all four and
// each warp's own weight chunks, copied with cp.async kPfBufs - 1 stages
// ahead (no weights wait in registers: they hold the 64 accumulators).
template <bool kGateUp>
__global__ void __launch_bounds__(kPfThreads, 1) moe_prefill_kernel(const MoeParams p) {
  constexpr int NA = 2;  // weight fragments per warp
  using namespace sm90;
  dev::pdl_wait_and_release();
  const int tile = blockIdx.y;
  if (tile >= p.tiles[0]) return;
  const int e = p.tiles[1 + 2 * tile], n0 = p.tiles[2 + 2 * tile];
  const int off = p.offsets[e] + n0, cnt = min(p.offsets[e + 1] - off, kPfTile);
  extern __shared__ __align__(16) unsigned char pf_smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int kw = warp & 3, r = warp >> 2;
  const int ch = kGateUp ? p.ch13 : p.ch2;
  const int nrb = (kGateUp ? p.inter : p.hidden) / 16;
  // Row block of fragment a; a fragment past the last row block reads zeros and writes nothing.
  int rb[NA];
  const uint4* wb[NA];
  const uint16_t* sb[NA];
  if constexpr (kGateUp) {
    rb[0] = rb[1] = blockIdx.x * kPfRB + r;
    const int64_t wo = int64_t(e) * p.stride13 + int64_t(rb[0]) * ch * 32;
    wb[0] = p.w1 + wo;
    wb[1] = p.w3 + wo;
    sb[0] = p.s1 + wo;
    sb[1] = p.s3 + wo;
  } else {
#pragma unroll
    for (int a = 0; a < NA; ++a) {
      rb[a] = (blockIdx.x * kPfRB + r) * NA + a;
      const int64_t wo = int64_t(e) * p.stride2 + int64_t(min(rb[a], nrb - 1)) * ch * 32;
      wb[a] = p.w2 + wo;
      sb[a] = p.s2 + wo;
    }
  }
  if ((threadIdx.x & 127) == 0) {  // this warp group's weights into L2 at once (as the decode kernels)
#pragma unroll
    for (int a = 0; a < NA; ++a)
      if (rb[a] < nrb) {
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(wb[a]), "r"(uint32_t(ch * 512)) : "memory");
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(sb[a]), "r"(uint32_t(ch * 64)) : "memory");
      }
  }
  // Activations: thread i copies 16 bytes (piece i%8) of token row i/8 of
  // each of the stage's 4 chunks; absent tokens and chunks past K are zeros.
  const int srow = threadIdx.x >> 3, piece = threadIdx.x & 7;
  const bool rvalid = srow < cnt;
  const __nv_bfloat16* src;
  if constexpr (kGateUp)
    src = p.x + int64_t(rvalid ? p.sorted_tok[off + srow] / p.topk : 0) * p.hidden + 8 * piece;
  else
    src = p.h + int64_t(rvalid ? off + srow : 0) * p.inter + 8 * piece;
  const int nst = (ch + 3) / 4;
  // Shared addresses of this thread's copies in buffer 0: x row piece, weight
  // lane, and (lanes 0..4NA-1) a quarter of a fragment's 64 scale bytes.
  const uint32_t sm0 = uint32_t(__cvta_generic_to_shared(pf_smem));
  const uint32_t xdst = sm0 + uint32_t(srow * kPfPitch + 8 * piece) * 2;
  const uint32_t wdst = sm0 + uint32_t(kPfXBytes + warp * NA * 512 + lane * 16);
  const int sa = lane < 4 * NA ? lane / 4 : 0;
  const uint32_t sdst = sm0 + uint32_t(kPfXBytes + kPfWBytes + (warp * NA + sa) * 64 + (lane % 4) * 16);
  const uint16_t* const ssrc = (sa ? sb[1] : sb[0]) + (lane % 4) * 8;  // selects: no local-memory array
  const bool sok = lane < 4 * NA && (sa ? rb[1] : rb[0]) < nrb;
  auto stage = [&](int s) {
    if (s < nst) {
      const uint32_t bo = uint32_t((s % kPfBufs) * kPfBufBytes);
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int c = 4 * s + q;
        const bool ok = rvalid && c < ch;
        cp_async16(xdst + bo + q * kPfTile * kPfPitch * 2, ok ? src + int64_t(c) * 64 : src, ok ? 16 : 0);
      }
      const int c = 4 * s + kw;
      const bool cin = c < ch;
#pragma unroll
      for (int a = 0; a < NA; ++a) {
        const bool ok = cin && rb[a] < nrb;
        cp_async16(wdst + bo + a * 512, wb[a] + (ok ? int64_t(c) * 32 + lane : 0), ok ? 16 : 0);
      }
      if (lane < 4 * NA) cp_async16(sdst + bo, ssrc + (cin && sok ? int64_t(c) * 32 : 0), cin && sok ? 16 : 0);
    }
    asm volatile("cp.async.commit_group;" ::: "memory");  // empty past the end: the wait count stays uniform
  };
  float acc[NA][kPfMT][4] = {};
#pragma unroll
  for (int s = 0; s < kPfBufs - 1; ++s) stage(s);
  for (int s = 0; s < nst; ++s) {
    stage(s + kPfBufs - 1);  // into the buffer computed at s - 1 (released by its closing barrier)
    asm volatile("cp.async.wait_group %0;" ::"n"(kPfBufs - 1) : "memory");
    __syncthreads();
    if (4 * s + kw < ch) {
      // Per accumulator: mma steps j = 0..3 of this chunk in order, as chunk_mma.
      const unsigned char* const buf = pf_smem + (s % kPfBufs) * kPfBufBytes;
      smem_chunk_mma<NA, kPfMT>(buf + kPfXBytes + warp * NA * 512, buf + kPfXBytes + kPfWBytes + warp * NA * 64,
                                reinterpret_cast<const __nv_bfloat16*>(buf) + (kw * kPfTile + g) * kPfPitch + 16 * t,
                                kPfPitch, lane, acc);
    }
    __syncthreads();  // this buffer is staged again at s + 1
  }
  asm volatile("cp.async.wait_group 0;" ::: "memory");
  __syncthreads();
  float* const red = reinterpret_cast<float*>(pf_smem) + r * 4 * kPfTile * 16;
  const int tid = threadIdx.x & 127;
  float v0[kPfMT], v1[kPfMT];
  reduce_warps_group<kPfMT>(acc[0], red, kw, tid, v0);
  reduce_warps_group<kPfMT>(acc[1], red, kw, tid, v1);
  if constexpr (kGateUp) {
    const float sc_g = kEpilogueFactor * p.scale2[e * 3], sc_u = kEpilogueFactor * p.scale2[e * 3 + 1];
#pragma unroll
    for (int q = 0; q < kPfMT; ++q) {
      const int n = (tid + 128 * q) / 16;
      if (n < cnt) {
        const float hv = swiglu_h(v0[q], v1[q], sc_g, sc_u, p.limit, p.sorted_w[off + n]);
        p.h[int64_t(off + n) * p.inter + rb[0] * 16 + tid % 16] = __float2bfloat16_rn(hv);
      }
    }
  } else {
    const float sc = kEpilogueFactor * p.scale2[e * 3 + 2];
#pragma unroll
    for (int q = 0; q < kPfMT; ++q) {
      const int n = (tid + 128 * q) / 16;
      if (n < cnt) {
        float* const yrow = p.yk + int64_t(p.sorted_tok[off + n]) * p.hidden + tid % 16;
        if (rb[0] < nrb) yrow[rb[0] * 16] = v0[q] * sc;
        if (rb[1] < nrb) yrow[rb[1] * 16] = v1[q] * sc;
      }
    }
  }
}

// y[t, d] = Σ_k yk[t·topk + k, d] over the k routed to a local expert (every k
// after an expert-parallel exchange), in k order (a fixed order: the top-k sum
// is deterministic, and the same with the experts on one rank or on many).
__global__ void moe_combine_kernel(const MoeParams p) {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;");
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= int64_t(p.T) * p.hidden) return;
  const int64_t t = i / p.hidden, d = i % p.hidden;
  float s = 0.f;
  for (int k = 0; k < p.topk; ++k) {
    const int le = p.ids[t * p.topk + k] - p.first;
    if (p.all_k || (le >= 0 && le < p.count)) s += p.yk[(t * p.topk + k) * p.hidden + d];
  }
  p.y[i] = s;
}

void upload_packed(DeviceBuffer& data, DeviceBuffer& scales, const std::vector<const LinearWeight*>& ws, int64_t N,
                   int64_t K, std::vector<float>& scale2, int which) {
  const int64_t rb = N / 16, ch = K / 64;
  const size_t dbytes = size_t(rb * ch) * 512, sbytes = size_t(rb * ch) * 64;
  data.alloc(dbytes * ws.size());
  scales.alloc(sbytes * ws.size());
  for (size_t i = 0; i < ws.size(); ++i) {
    const LinearWeight& w = *ws[i];
    CM_CU_CHECK(w.out_features == N && w.in_features == K, "expert weight '%s': shape %lldx%lld, expected %lldx%lld",
                w.name.c_str(), (long long)w.out_features, (long long)w.in_features, (long long)N, (long long)K);
    Nvfp4Packed p = pack_nvfp4(w);
    data.upload(p.data.data(), dbytes, dbytes * i);
    scales.upload(p.scales.data(), sbytes, sbytes * i);
    scale2[i * 3 + which] = p.scale_2;
  }
}

}  // namespace

DeviceExperts upload_experts(const std::vector<const LinearWeight*>& gate, const std::vector<const LinearWeight*>& up,
                             const std::vector<const LinearWeight*>& down, int first, float swiglu_limit) {
  CM_CU_CHECK(!gate.empty() && gate.size() == up.size() && gate.size() == down.size(),
              "upload_experts: need the same number (>0) of gate, up and down weights");
  DeviceExperts d;
  d.inter = gate[0]->out_features;
  d.hidden = gate[0]->in_features;
  d.first = first;
  d.count = int(gate.size());
  d.swiglu_limit = swiglu_limit;
  CM_CU_CHECK(d.hidden % 64 == 0 && d.inter % 64 == 0, "experts: hidden (%lld) and intermediate (%lld) must be multiples of 64",
              (long long)d.hidden, (long long)d.inter);
  CM_CU_CHECK(d.count <= 1024, "experts: at most 1024 local experts, got %d", d.count);
  std::vector<float> s2(size_t(d.count) * 3, 1.0f);
  upload_packed(d.w1, d.s1, gate, d.inter, d.hidden, s2, 0);
  upload_packed(d.w3, d.s3, up, d.inter, d.hidden, s2, 1);
  upload_packed(d.w2, d.s2, down, d.hidden, d.inter, s2, 2);
  d.scale2.alloc(s2.size() * 4);
  d.scale2.upload(s2.data(), s2.size() * 4);
  return d;
}

DeviceExperts random_experts(int64_t hidden, int64_t inter, int first, int count, uint64_t seed) {
  CM_CU_CHECK(hidden % 64 == 0 && inter % 64 == 0 && count > 0 && count <= 1024, "random_experts: bad shape");
  DeviceExperts d;
  d.hidden = hidden;
  d.inter = inter;
  d.first = first;
  d.count = count;
  const size_t dbytes = size_t(hidden / 16 * inter / 64) * 512 * count, sbytes = dbytes / 8;
  DeviceBuffer* bufs[3][2] = {{&d.w1, &d.s1}, {&d.w3, &d.s3}, {&d.w2, &d.s2}};
  for (int m = 0; m < 3; ++m) {
    bufs[m][0]->alloc(dbytes);
    bufs[m][1]->alloc(sbytes);
    fill_random_packed(bufs[m][0]->get(), dbytes, bufs[m][1]->get(), sbytes, seed + 7919 * m);
  }
  std::vector<float> s2(size_t(count) * 3, 1.0f / 64.0f);
  d.scale2.alloc(s2.size() * 4);
  d.scale2.upload(s2.data(), s2.size() * 4);
  return d;
}

MoeScratch::MoeScratch(const DeviceExperts& e, int max_tokens_, int topk_) : max_tokens(max_tokens_), topk(topk_) {
  const size_t slots = size_t(max_tokens) * topk;
  offsets.alloc(size_t(e.count + 2) * 4);
  active.alloc(size_t(e.count) * 4);
  sorted_tok.alloc(slots * 4);
  sorted_w.alloc(slots * 4);
  h.alloc(slots * size_t(e.inter) * 2);
  xq.alloc(size_t(max_tokens) * size_t(e.hidden) * 2);
  yk.alloc(slots * size_t(e.hidden) * 4);
  // An expert with c tokens has ceil(c/64) <= c/64 + 1 tiles: at most
  // slots/64 + (active experts) in all.
  const int64_t mt = int64_t(slots / kPfTile) + std::min<int64_t>(int64_t(slots), e.count);
  CM_CU_CHECK(mt <= 65535, "moe: %lld prefill tiles exceed the grid limit (max_tokens %d, topk %d)", (long long)mt,
              max_tokens, topk);
  max_tiles = int(mt);
  tiles.alloc(size_t(1 + 2 * max_tiles) * 4);
}

void setup_moe_kernels() {
  CM_CUDA(cudaFuncSetAttribute(moe_prefill_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kPfSmem)));
  CM_CUDA(cudaFuncSetAttribute(moe_prefill_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kPfSmem)));
}

void moe_nvfp4(Context& ctx, const DeviceExperts& e, MoeScratch& s, const uint16_t* x, int T, const int32_t* ids,
               const float* weights, float* y, MoePath path, const MoeExchange* exchange) {
  CM_CU_CHECK(T >= 0 && T <= s.max_tokens, "moe: %d tokens exceed the scratch capacity %d", T, s.max_tokens);
  if (T == 0) return;
  MoeParams p{};
  p.w1 = e.w1.as<const uint4>();
  p.w3 = e.w3.as<const uint4>();
  p.w2 = e.w2.as<const uint4>();
  p.s1 = e.s1.as<const uint16_t>();
  p.s3 = e.s3.as<const uint16_t>();
  p.s2 = e.s2.as<const uint16_t>();
  p.scale2 = e.scale2.as<const float>();
  p.hidden = int(e.hidden);
  p.inter = int(e.inter);
  p.ch13 = int(e.hidden / 64);
  p.ch2 = int(e.inter / 64);
  p.stride13 = int64_t(e.inter / 16) * p.ch13 * 32;
  p.stride2 = int64_t(e.hidden / 16) * p.ch2 * 32;
  p.count = e.count;
  p.limit = e.swiglu_limit;
  p.x = reinterpret_cast<const __nv_bfloat16*>(x);
  p.T = T;
  p.topk = s.topk;
  p.first = e.first;
  p.ids = ids;
  p.weights = weights;
  p.offsets = s.offsets.as<int>();
  p.active = s.active.as<int>();
  p.sorted_tok = s.sorted_tok.as<int>();
  p.sorted_w = s.sorted_w.as<float>();
  p.h = s.h.as<__nv_bfloat16>();
  p.yk = s.yk.as<float>();
  p.y = y;
  const bool prefill = path == MoePath::prefill || path == MoePath::prefill_mma ||
                       (path == MoePath::automatic && T >= kMoePrefillMinTokens);
  if (prefill) p.tiles = s.tiles.as<int>();
  const int64_t slots = int64_t(T) * s.topk;
  if (exchange) {  // the rows of other ranks' experts stay +0 here: the all-reduce then adds exact zeros
    p.all_k = 1;
    CM_CUDA(cudaMemsetAsync(p.yk, 0, size_t(slots) * size_t(e.hidden) * 4, ctx.stream()));
  }
  launch_kernel(ctx, moe_route_kernel, dim3(1), dim3(1024), 0, "moe_route_kernel", p);
  if (prefill) {
    // The scratch's bound on this step's tiles: slots/64 + min(count, slots).
    const unsigned tiles = unsigned(slots / kPfTile + std::min<int64_t>(slots, e.count));
    if (path != MoePath::prefill_mma && moe::wgmma_unsupported(e) == nullptr) {
      moe::prefill_wgmma(ctx, e, s, p, tiles);
    } else {
      launch_kernel(ctx, moe_prefill_kernel<true>, dim3(unsigned(e.inter / 16 / kPfRB), tiles), dim3(kPfThreads),
                    kPfSmem, "moe_prefill_gate_up_kernel", p);
      const unsigned down_groups = unsigned((e.hidden / 16 + 2 * kPfRB - 1) / (2 * kPfRB));  // 2 row blocks per warp
      launch_kernel(ctx, moe_prefill_kernel<false>, dim3(down_groups, tiles), dim3(kPfThreads), kPfSmem,
                    "moe_prefill_down_kernel", p);
    }
  } else {
    const unsigned max_active = unsigned(std::min<int64_t>(slots, e.count));
    const dim3 g1(unsigned(e.inter / 16), max_active), g2(unsigned(e.hidden / 16), max_active);
    // An expert holds at most T*topk tokens: with <= 8 one 8-token pass suffices.
    if (slots <= 8) {
      launch_kernel(ctx, moe_gate_up_kernel<1>, g1, dim3(128), 0, "moe_gate_up_kernel", p);
      launch_kernel(ctx, moe_down_kernel<1>, g2, dim3(128), 0, "moe_down_kernel", p);
    } else {
      launch_kernel(ctx, moe_gate_up_kernel<2>, g1, dim3(128), 0, "moe_gate_up_kernel", p);
      launch_kernel(ctx, moe_down_kernel<2>, g2, dim3(128), 0, "moe_down_kernel", p);
    }
  }
  if (exchange) exchange->all_reduce_sum(exchange->ctx, p.yk, slots * e.hidden);
  const int64_t outs = int64_t(T) * e.hidden;
  launch_kernel(ctx, moe_combine_kernel, dim3(unsigned((outs + 255) / 256)), dim3(256), 0, "moe_combine_kernel", p);
}

}  // namespace cm::cuda
