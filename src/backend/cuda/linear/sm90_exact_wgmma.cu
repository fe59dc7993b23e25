// The activation reorder of the exact wgmma linears (sm90_exact_wgmma.cuh).
#include "backend/cuda/linear/sm90_exact_wgmma.cuh"

#include "backend/cuda/linear/sm90_tma.cuh"

namespace cm::cuda::exact_wgmma {

namespace {

// Position p of a chunk's reordered row holds activation k = 16t + 4j + 2h + i for p = 16j + 8h + 2t + i.
// One thread writes one 16-byte unit u = 2j + h (positions 8u .. 8u + 7) of one token row: pairs at
// k = 16t + 2u, t = 0..3. Tokens >= M and k >= K are zeros, as the decode kernels read them.
__global__ void __launch_bounds__(256) reorder_kernel(const uint16_t* __restrict__ x, int64_t ldx, int M, int K,
                                                      int chunks, int gchunks, uint8_t* __restrict__ xp) {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  const int gc = blockIdx.x, tt = blockIdx.y;
  const int grp = gc / chunks, c = gc % chunks;
  uint8_t* tile = xp + (int64_t(tt) * gchunks + gc) * kXTile;
  for (int e = threadIdx.x; e < kToks * 8; e += blockDim.x) {
    const int r = e >> 3, u = e & 7, tok = tt * kToks + r;
    uint32_t v[4];
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      const int k = c * 64 + 16 * t + 2 * u;
      v[t] = (tok < M && k < K)
                 ? *reinterpret_cast<const uint32_t*>(x + int64_t(tok) * ldx + int64_t(grp) * K + k)
                 : 0u;
    }
    *reinterpret_cast<uint4*>(tile + sm90::sw128_offset(r, 8 * u)) = make_uint4(v[0], v[1], v[2], v[3]);
  }
}

}  // namespace

void reorder_x(Context& ctx, const uint16_t* x, int64_t ldx, int64_t M, int K, int chunks, int groups, uint8_t* xp) {
  CM_CU_CHECK((ldx % 2) == 0 && (reinterpret_cast<uintptr_t>(x) % 4) == 0,
              "exact wgmma linear: activations must be 4-byte aligned rows");
  const int gchunks = groups * chunks;
  launch_kernel(ctx, reorder_kernel, dim3(unsigned(gchunks), unsigned((M + kToks - 1) / kToks)), dim3(256), 0,
                "exact_wgmma_reorder_kernel", x, ldx, int(M), K, chunks, gchunks, xp);
}

}  // namespace cm::cuda::exact_wgmma
