// What the batch-invariant GEMMs assume of Hopper's tensor cores, checked on the device.
//
// The decode kernels (mma.sync m16n8k16) fix a row's bits; a wgmma kernel for large M can only give
// the same bits if one k16 step of wgmma rounds exactly as one k16 step of mma.sync for the same
// operands in the same logical k positions and the same fp32 accumulator. The tests run random
// 64 x 8 x 16 tiles (bf16 operands over a wide exponent range, with cancellation, fp32 accumulators)
// through:
//  - mma.sync m16n8k16 (4 warps x 16 rows): the reference D = A·Bᵀ + C;
//  - wgmma m64n8k16 with A and B from shared memory (SS) and with A from registers (RS);
//  - mma.sync with the roles swapped (Dᵀ = B·Aᵀ + Cᵀ: activations as the A operand);
//  - mma.sync on the same 16 products in another logical k order (reported, not assumed).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <utility>
#include <vector>

#include "gpu_test_util.h"

namespace cm {
namespace {

constexpr int kTiles = 4096;

__device__ __forceinline__ uint32_t pack2(uint16_t lo, uint16_t hi) { return uint32_t(lo) | (uint32_t(hi) << 16); }

__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// K-major 128-byte-swizzled operand: rows of 128 bytes, unit u of row r at u ^ (r % 8).
__device__ __forceinline__ uint64_t desc_sw128(uint32_t addr) {
  uint64_t d = 0;
  d |= uint64_t((addr & 0x3FFFF) >> 4);
  d |= uint64_t(1) << 16;
  d |= uint64_t(1024 >> 4) << 32;
  d |= uint64_t(1) << 62;
  return d;
}
__device__ __forceinline__ int sw128(int r, int k) { return r * 128 + (((k >> 3) ^ (r & 7)) << 4) + (k & 7) * 2; }

__device__ __forceinline__ void wgmma_ss(float (&d)[4], uint64_t da, uint64_t db) {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0,%1,%2,%3}, %4, %5, 1, 1, 1, 0, 0;\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "l"(da), "l"(db));
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}

__device__ __forceinline__ void wgmma_rs(float (&d)[4], const uint32_t (&a)[4], uint64_t db) {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0,%1,%2,%3}, {%4,%5,%6,%7}, %8, 1, 1, 1, 0;\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}

// Per tile: A bf16 [64][16], B bf16 [8][16] (n x k), C f32 [64][8], perm [16] (a permutation of k).
// Outputs f32 [5][64][8]: mma.sync, wgmma SS, wgmma RS, roles swapped, k permuted.
__global__ void __launch_bounds__(128) numerics_kernel(const uint16_t* A, const uint16_t* B, const float* C,
                                                       const uint8_t* perm, float* out) {
  __shared__ __align__(1024) uint8_t sa[64 * 128];
  __shared__ __align__(1024) uint8_t sb[8 * 128];
  const int tile = blockIdx.x, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const uint16_t* a = A + size_t(tile) * 64 * 16;
  const uint16_t* b = B + size_t(tile) * 8 * 16;
  const float* c = C + size_t(tile) * 64 * 8;
  const uint8_t* pm = perm + size_t(tile) * 16;
  float* o = out + size_t(tile) * 5 * 64 * 8;
  for (int i = tid; i < 64 * 16; i += 128) *reinterpret_cast<uint16_t*>(sa + sw128(i / 16, i % 16)) = a[i];
  for (int i = tid; i < 8 * 16; i += 128) *reinterpret_cast<uint16_t*>(sb + sw128(i / 16, i % 16)) = b[i];
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  __syncthreads();
  const int r0 = 16 * warp + g, r1 = r0 + 8;
  auto afrag = [&](uint32_t(&f)[4], bool permuted) {
    auto at = [&](int r, int k) { return a[r * 16 + (permuted ? pm[k] : k)]; };
    f[0] = pack2(at(r0, 2 * t), at(r0, 2 * t + 1));
    f[1] = pack2(at(r1, 2 * t), at(r1, 2 * t + 1));
    f[2] = pack2(at(r0, 2 * t + 8), at(r0, 2 * t + 9));
    f[3] = pack2(at(r1, 2 * t + 8), at(r1, 2 * t + 9));
  };
  auto bat = [&](int n, int k, bool permuted) { return b[n * 16 + (permuted ? pm[k] : k)]; };
  auto store = [&](int which, const float (&d)[4]) {  // accumulator layout of m16n8 / m64n8
    float* q = o + which * 64 * 8;
    q[r0 * 8 + 2 * t] = d[0];
    q[r0 * 8 + 2 * t + 1] = d[1];
    q[r1 * 8 + 2 * t] = d[2];
    q[r1 * 8 + 2 * t + 1] = d[3];
  };
  auto cinit = [&](float(&d)[4]) {
    d[0] = c[r0 * 8 + 2 * t];
    d[1] = c[r0 * 8 + 2 * t + 1];
    d[2] = c[r1 * 8 + 2 * t];
    d[3] = c[r1 * 8 + 2 * t + 1];
  };
  uint32_t af[4];
  afrag(af, false);
  {  // mma.sync
    float d[4];
    cinit(d);
    mma16816(d, af, pack2(bat(g, 2 * t, false), bat(g, 2 * t + 1, false)),
             pack2(bat(g, 2 * t + 8, false), bat(g, 2 * t + 9, false)));
    store(0, d);
  }
  {  // wgmma SS
    float d[4];
    cinit(d);
    wgmma_ss(d, desc_sw128(uint32_t(__cvta_generic_to_shared(sa))), desc_sw128(uint32_t(__cvta_generic_to_shared(sb))));
    store(1, d);
  }
  {  // wgmma RS
    float d[4];
    cinit(d);
    wgmma_rs(d, af, desc_sw128(uint32_t(__cvta_generic_to_shared(sb))));
    store(2, d);
  }
  {  // roles swapped: A operand = B rows n (0..7, rows 8..15 zero), B operand = this warp's rows of A
    // in two groups of 8 (columns); D'[n][m] lands in D[m][n]'s slot.
    for (int h = 0; h < 2; ++h) {
      const int m = 16 * warp + 8 * h + g;  // this lane's B-operand column
      uint32_t f[4];
      f[0] = pack2(bat(g, 2 * t, false), bat(g, 2 * t + 1, false));
      f[1] = 0;
      f[2] = pack2(bat(g, 2 * t + 8, false), bat(g, 2 * t + 9, false));
      f[3] = 0;
      // accumulators: d[0] = D'[g][2t] = D[16w+8h+2t][g], d[1] = D[16w+8h+2t+1][g]; d[2], d[3]: padded rows
      const int m0 = 16 * warp + 8 * h + 2 * t;
      float d[4] = {c[m0 * 8 + g], c[(m0 + 1) * 8 + g], 0.f, 0.f};
      mma16816(d, f, pack2(a[m * 16 + 2 * t], a[m * 16 + 2 * t + 1]), pack2(a[m * 16 + 2 * t + 8], a[m * 16 + 2 * t + 9]));
      float* q = o + 3 * 64 * 8;
      q[m0 * 8 + g] = d[0];
      q[(m0 + 1) * 8 + g] = d[1];
    }
  }
  {  // the same products in another logical k order
    uint32_t pf[4];
    afrag(pf, true);
    float d[4];
    cinit(d);
    mma16816(d, pf, pack2(bat(g, 2 * t, true), bat(g, 2 * t + 1, true)),
             pack2(bat(g, 2 * t + 8, true), bat(g, 2 * t + 9, true)));
    store(4, d);
  }
}

uint64_t next(uint64_t& s) {
  s ^= s << 13;
  s ^= s >> 7;
  s ^= s << 17;
  return s;
}

// bf16 with a random sign, exponent in [-e, e] and mantissa; one in 8 zero.
uint16_t rand_bf16(uint64_t& s, int e) {
  const uint64_t r = next(s);
  if ((r & 7) == 0) return 0;
  const int ex = int((r >> 3) % uint64_t(2 * e + 1)) - e + 127;
  return uint16_t(((r >> 20) & 1) << 15 | uint32_t(ex) << 7 | ((r >> 24) & 0x7F));
}

float rand_f32(uint64_t& s, int e) {
  const uint64_t r = next(s);
  if ((r & 7) == 0) return 0.f;
  const int ex = int((r >> 3) % uint64_t(2 * e + 1)) - e + 127;
  const uint32_t u = uint32_t(((r >> 20) & 1) << 31) | uint32_t(ex) << 23 | uint32_t((r >> 32) & 0x7FFFFF);
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

TEST(TensorCoreNumerics, WgmmaMatchesMmaSyncBitForBit) {
  CM_SKIP_WITHOUT_GPU();
  uint64_t s = 0x9E3779B97F4A7C15ull;
  std::vector<uint16_t> A(size_t(kTiles) * 64 * 16), B(size_t(kTiles) * 8 * 16);
  std::vector<float> C(size_t(kTiles) * 64 * 8);
  std::vector<uint8_t> P(size_t(kTiles) * 16);
  for (int tile = 0; tile < kTiles; ++tile) {
    // Tiles alternate between a narrow range (sums with cancellation among similar magnitudes)
    // and a wide one (alignment shifts past the fp32 mantissa), accumulators from zero to large.
    const int e = tile % 3 == 0 ? 2 : tile % 3 == 1 ? 12 : 30;
    for (int i = 0; i < 64 * 16; ++i) A[size_t(tile) * 1024 + i] = rand_bf16(s, e);
    for (int i = 0; i < 8 * 16; ++i) B[size_t(tile) * 128 + i] = rand_bf16(s, e);
    for (int i = 0; i < 64 * 8; ++i) C[size_t(tile) * 512 + i] = tile % 4 == 0 ? 0.f : rand_f32(s, e + 4);
    uint8_t* p = &P[size_t(tile) * 16];
    for (int k = 0; k < 16; ++k) p[k] = uint8_t(k);
    for (int k = 15; k > 0; --k) std::swap(p[k], p[next(s) % uint64_t(k + 1)]);
  }
  cuda::DeviceBuffer dA(A.size() * 2), dB(B.size() * 2), dC(C.size() * 4), dP(P.size()),
      dO(size_t(kTiles) * 5 * 512 * 4);
  dA.upload(A.data(), A.size() * 2);
  dB.upload(B.data(), B.size() * 2);
  dC.upload(C.data(), C.size() * 4);
  dP.upload(P.data(), P.size());
  numerics_kernel<<<kTiles, 128>>>(dA.as<uint16_t>(), dB.as<uint16_t>(), dC.as<float>(), dP.as<uint8_t>(),
                                   dO.as<float>());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<float> O(size_t(kTiles) * 5 * 512);
  dO.download(O.data(), O.size() * 4);
  int64_t diff[5] = {0, 0, 0, 0, 0}, nonzero = 0;
  for (int tile = 0; tile < kTiles; ++tile)
    for (int i = 0; i < 512; ++i) {
      const float* o = &O[size_t(tile) * 5 * 512];
      uint32_t ref;
      std::memcpy(&ref, &o[i], 4);
      nonzero += o[i] != 0.f;
      for (int w = 1; w < 5; ++w) {
        uint32_t v;
        std::memcpy(&v, &o[w * 512 + i], 4);
        diff[w] += v != ref;
      }
    }
  const int64_t total = int64_t(kTiles) * 512;
  std::printf("tensor-core numerics over %lld outputs (%lld nonzero): wgmma SS differs in %lld, wgmma RS in %lld, "
              "roles swapped in %lld, k order permuted in %lld\n",
              (long long)total, (long long)nonzero, (long long)diff[1], (long long)diff[2], (long long)diff[3],
              (long long)diff[4]);
  EXPECT_GT(nonzero, total / 2);
  EXPECT_EQ(diff[1], 0) << "wgmma (shared-memory operands) rounds differently from mma.sync";
  EXPECT_EQ(diff[2], 0) << "wgmma (register A) rounds differently from mma.sync";
  EXPECT_EQ(diff[3], 0) << "swapping the A and B roles changes the bits";
}

}  // namespace
}  // namespace cm
