// Grouped NVFP4 MoE decode kernels (see cuda_moe.h).
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
#include <cuda_bf16.h>

#include <algorithm>

#include "backend/cuda/cuda_linear.h"
#include "backend/cuda/cuda_moe.h"
#include "backend/cuda/nvfp4_pack.h"
#include "backend/cuda/ops_device.cuh"
#include "backend/cuda/sm90_nvfp4.cuh"

namespace cm::cuda {

namespace {

struct MoeParams {
  const uint4 *w1, *w3, *w2;
  const uint16_t *s1, *s3, *s2;
  const float* scale2;
  int64_t stride13, stride2;  // uint4 per expert (u16 scale stride is the same number)
  int hidden, inter, ch13, ch2, count;
  float limit;
  const __nv_bfloat16* x;
  int T, topk, first;
  const int32_t* ids;
  const float* weights;
  int* offsets;  // [count + 2]: offsets[e], offsets[count] = total, offsets[count+1] = active count
  int* active;   // [count]
  int* sorted_tok;   // the (token, k) slot t·topk + k of each expert-major row
  float* sorted_w;
  __nv_bfloat16* h;  // [T*topk, inter]
  float* yk;         // [T*topk, hidden]: one row per (token, k)
  float* y;          // [T, hidden]
};

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
        const float gg = fminf(gv[q] * sc_g, p.limit);
        const float uu = fminf(fmaxf(uv[q] * sc_u, -p.limit), p.limit);
        const float hv = gg / (1.0f + expf(-gg)) * uu * p.sorted_w[off + n];
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

// y[t, d] = Σ_k yk[t·topk + k, d] over the k routed to a local expert, in k
// order (a fixed order: the top-k sum is deterministic).
__global__ void moe_combine_kernel(const MoeParams p) {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;");
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= int64_t(p.T) * p.hidden) return;
  const int64_t t = i / p.hidden, d = i % p.hidden;
  float s = 0.f;
  for (int k = 0; k < p.topk; ++k) {
    const int le = p.ids[t * p.topk + k] - p.first;
    if (le >= 0 && le < p.count) s += p.yk[(t * p.topk + k) * p.hidden + d];
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
  yk.alloc(slots * size_t(e.hidden) * 4);
}

void moe_nvfp4(Context& ctx, const DeviceExperts& e, MoeScratch& s, const uint16_t* x, int T, const int32_t* ids,
               const float* weights, float* y) {
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
  const unsigned max_active = unsigned(std::min<int64_t>(int64_t(T) * s.topk, e.count));
  launch_kernel(ctx, moe_route_kernel, dim3(1), dim3(1024), 0, "moe_route_kernel", p);
  const dim3 g1(unsigned(e.inter / 16), max_active), g2(unsigned(e.hidden / 16), max_active);
  // An expert holds at most T*topk tokens: with <= 8 one 8-token pass suffices.
  if (int64_t(T) * s.topk <= 8) {
    launch_kernel(ctx, moe_gate_up_kernel<1>, g1, dim3(128), 0, "moe_gate_up_kernel", p);
    launch_kernel(ctx, moe_down_kernel<1>, g2, dim3(128), 0, "moe_down_kernel", p);
  } else {
    launch_kernel(ctx, moe_gate_up_kernel<2>, g1, dim3(128), 0, "moe_gate_up_kernel", p);
    launch_kernel(ctx, moe_down_kernel<2>, g2, dim3(128), 0, "moe_down_kernel", p);
  }
  const int64_t outs = int64_t(T) * e.hidden;
  launch_kernel(ctx, moe_combine_kernel, dim3(unsigned((outs + 255) / 256)), dim3(256), 0, "moe_combine_kernel", p);
}

}  // namespace cm::cuda
