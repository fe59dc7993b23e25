// The KV compressor on the GPU (see ops/compressor.h).
// pool:  one CTA per batch token; only tokens that complete a block (pos+1 ≡ 0
//        mod m) work. Each thread owns channels; for each it takes the max and
//        the exp-weighted sums over the block's slots in slot order (the
//        CPU's order), reading every position's row from the batch or from
//        the slot's pending ring. The pooled vector is staged in shared
//        memory, RMSNorm'd (fixed-order block sum), RoPE'd at e·m and stored
//        as a bf16 entry.
// store: one CTA per batch token: keeps the row unless a later token of the
//        same chunk lands on the same ring row.
// Both kernels wait for the previous kernel before reading (PDL), so pool
// always sees the ring before store overwrites it.
#include "backend/cuda/core/cuda_util.h"
#include "backend/cuda/core/ops_device.cuh"
#include "ops/compressor.h"
#include "ops/rope.h"

namespace cm {

namespace {

struct PoolParams {
  CompressorStateView st;
  const float* ape;
  const float* norm_w;
  float eps;
  const float* freqs;
  int rope_dim;
  float af;
  const float* kv;
  const float* gate;
  const int32_t* slot;
  const int32_t* pos;
  int64_t n;
};

// Row of position q (same slot as batch token i at position p), from the
// batch when this step holds it, else from the slot's ring.
__device__ __forceinline__ int64_t batch_row(const int32_t* slot, const int32_t* pos, int64_t n, int64_t i,
                                             int64_t p, int64_t q) {
  const int64_t j = i - (p - q);
  return (j >= 0 && j < n && slot[j] == slot[i] && pos[j] == q) ? j : -1;
}

__global__ void compressor_pool_kernel(const PoolParams p) {
  cuda::dev::pdl_wait_and_release();
  extern __shared__ float pooled[];
  __shared__ float tmp[32];
  const int64_t i = blockIdx.x;
  const int64_t P = p.pos[i];
  const CompressorStateView& st = p.st;
  const int64_t m = st.ratio, c = st.c, dc = st.dc, width = c * dc, cm = c * m;
  if ((P + 1) % m != 0) return;
  const int64_t e = (P + 1) / m - 1, s = p.slot[i];
  if (e >= st.max_entries || s < 0 || s >= st.max_slots) return;  // the host checks capacity; never write outside
  const int64_t first_q = c == 2 ? (e - 1) * m : e * m;  // first position pooled (CSA: the previous block)
  for (int64_t ch = threadIdx.x; ch < dc; ch += blockDim.x) {
    // slots in order: CSA prev block's A halves (absent for e = 0), then this block's B halves
    float mx = -INFINITY;
    for (int64_t k = 0; k < cm; ++k) {
      const int64_t q = first_q + k;
      if (q < 0) continue;
      const int64_t col = (c == 2 && k >= m) ? dc + ch : ch;
      const int64_t j = batch_row(p.slot, p.pos, p.n, i, P, q);
      const float g = (j >= 0 ? p.gate[j * width + col] : st.pend_gate[(s * cm + q % cm) * width + col]) +
                      p.ape[(q % m) * width + col];
      mx = fmaxf(mx, g);
    }
    float den = 0.f, acc = 0.f;
    for (int64_t k = 0; k < cm; ++k) {
      const int64_t q = first_q + k;
      if (q < 0) continue;
      const int64_t col = (c == 2 && k >= m) ? dc + ch : ch;
      const int64_t j = batch_row(p.slot, p.pos, p.n, i, P, q);
      const int64_t src = j >= 0 ? j * width + col : (s * cm + q % cm) * width + col;
      const float g = (j >= 0 ? p.gate[src] : st.pend_gate[src]) + p.ape[(q % m) * width + col];
      if (g == -INFINITY) continue;
      const float ex = expf(g - mx);
      den += ex;
      acc += ex * (j >= 0 ? p.kv[src] : st.pend_kv[src]);
    }
    pooled[ch] = acc / den;
  }
  float ss = 0.f;
  for (int64_t ch = threadIdx.x; ch < dc; ch += blockDim.x) ss += pooled[ch] * pooled[ch];
  ss = cuda::dev::block_sum(ss, tmp);  // syncs, so pooled[] is complete
  const float inv = 1.0f / sqrtf(ss / float(dc) + p.eps);
  for (int64_t ch = threadIdx.x; ch < dc; ch += blockDim.x) pooled[ch] = p.norm_w[ch] * (pooled[ch] * inv);
  __syncthreads();
  uint16_t* out = st.entries + (s * st.max_entries + e) * dc;
  const int64_t nope = dc - p.rope_dim;
  for (int64_t ch = threadIdx.x; ch < nope; ch += blockDim.x) out[ch] = cuda::dev::to_bf(pooled[ch]);
  for (int k = threadIdx.x; k < p.rope_dim / 2; k += blockDim.x) {
    float a = pooled[nope + 2 * k], b = pooled[nope + 2 * k + 1];
    cuda::dev::rope_pair(a, b, p.freqs[k], e * m, p.af, false);
    out[nope + 2 * k] = cuda::dev::to_bf(a);
    out[nope + 2 * k + 1] = cuda::dev::to_bf(b);
  }
}

__global__ void compressor_store_kernel(const CompressorStateView st, const float* kv, const float* gate,
                                        const int32_t* slot, const int32_t* pos, int64_t n) {
  cuda::dev::pdl_wait_and_release();
  const int64_t i = blockIdx.x, cm = st.c * st.ratio, width = st.c * st.dc;
  const int64_t s = slot[i];
  if (i + cm < n && slot[i + cm] == s) return;  // a later row of this chunk takes the ring row
  if (s < 0 || s >= st.max_slots) return;
  const int64_t r = (s * cm + pos[i] % cm) * width;
  for (int64_t k = threadIdx.x; k < width; k += blockDim.x) {
    st.pend_kv[r + k] = kv[i * width + k];
    st.pend_gate[r + k] = gate[i * width + k];
  }
}

}  // namespace

void compressor_step_cuda(cuda::Context& ctx, const CompressorStateView& st, const float* ape, const float* norm_w,
                          float eps, const RopeView& rope, const float* kv, const float* gate, const int32_t* slot,
                          const int32_t* pos, int64_t n) {
  CM_CU_CHECK(st.ratio > 0 && (st.c == 1 || st.c == 2) && st.dc > 0 && st.dc <= 8192,
              "compressor_step_cuda: bad state shape (ratio %lld, c %lld, width %lld)", (long long)st.ratio,
              (long long)st.c, (long long)st.dc);
  CM_CU_CHECK(st.pend_kv && st.pend_gate && st.entries && st.max_slots > 0,
              "compressor_step_cuda: state buffers are not allocated");
  CM_CU_CHECK(rope.freqs && rope.rope_dim > 0 && rope.rope_dim % 2 == 0 && rope.rope_dim <= st.dc,
              "compressor_step_cuda: RoPE of %lld channels does not fit entries of %lld", (long long)rope.rope_dim,
              (long long)st.dc);
  if (n <= 0) return;
  CM_CU_CHECK(n < (int64_t(1) << 31), "compressor_step_cuda: %lld tokens exceed the grid", (long long)n);
  PoolParams p{st, ape, norm_w, eps, rope.freqs, int(rope.rope_dim), rope.attention_factor, kv, gate, slot, pos, n};
  // A thread per channel up to 512 (each channel's pooling is a chain of dependent loads over the
  // block's positions; 128 threads gave a one-token CSA step ~20 µs of it).
  const unsigned threads = unsigned(std::min<int64_t>(512, (st.dc + 31) / 32 * 32));
  cuda::launch_kernel(ctx, compressor_pool_kernel, dim3(unsigned(n)), dim3(threads), size_t(st.dc) * 4,
                      "compressor_pool_kernel", p);
  cuda::launch_kernel(ctx, compressor_store_kernel, dim3(unsigned(n)), dim3(128), 0, "compressor_store_kernel", st, kv,
                      gate, slot, pos, n);
}

}  // namespace cm
