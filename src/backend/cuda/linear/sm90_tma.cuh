// Hopper building blocks of the wgmma kernels (sm90_nvfp4_wgmma.cu, sm90_nvfp4_exact_wgmma.cu): the 2-D
// tensor copy into a 128-byte-swizzled tile, wgmma fences, the K-major 128B-swizzle descriptor and its
// element offsets, named barriers, and the driver's tensor-map encoder.
#pragma once
#include <cuda.h>
#include <cudaTypedefs.h>

#include <cstdint>

namespace cm::cuda {

// A 2-D tensor map (cuTensorMapEncodeTiled from the driver) over `outer` rows of `inner` elements,
// rows row_bytes apart, boxes of box_outer x box_inner; throws cm::Error naming the linear when the
// driver lacks the entry point or refuses the map.
CUtensorMap encode_tensor_map_2d(CUtensorMapDataType type, const void* base, uint64_t inner, uint64_t outer,
                                 uint64_t row_bytes, uint32_t box_inner, uint32_t box_outer, CUtensorMapSwizzle swizzle,
                                 const char* name);

namespace sm90 {

__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, int c0, int c1, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
      ::"r"(dst), "l"(map), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}

// Keeps the compiler from moving accumulator reads above the wgmma wait.
template <int R>
__device__ __forceinline__ void fence_regs(float (&r)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(r[i])::"memory");
}

__device__ __forceinline__ void named_barrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// K-major operand, 128-byte swizzle: rows of 128 bytes, 8-row atoms 1024 bytes apart.
__device__ __forceinline__ uint64_t desc_sw128(uint32_t addr) {
  uint64_t d = 0;
  d |= uint64_t((addr & 0x3FFFF) >> 4);
  d |= uint64_t(1) << 16;            // leading byte offset (unused with swizzle)
  d |= uint64_t(1024 >> 4) << 32;    // stride byte offset: next 8-row atom
  d |= uint64_t(1) << 62;            // 128B swizzle
  return d;
}

// Byte offset of bf16 element (r, k), k < 64, in a 128B-swizzled tile: 16-byte unit k/8 of row r
// lands at unit (k/8) ^ (r % 8), the layout TMA's SWIZZLE_128B writes and desc_sw128 reads.
__device__ __forceinline__ uint32_t sw128_offset(int r, int k) {
  return uint32_t(r * 128 + ((((k >> 3) ^ r) & 7) << 4) + (k & 7) * 2);
}

}  // namespace sm90
}  // namespace cm::cuda
