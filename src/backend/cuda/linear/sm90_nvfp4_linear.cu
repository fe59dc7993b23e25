// NVFP4 linear kernels for Hopper (see linear.h): the decode kernel's NVFP4 format (the kernel itself
// is sm90_decode.cuh's, shared with FP8), the exact BF16 expansion for the cuBLAS prefill, random
// weights for the benchmarks, and the choice of prefill path.
#include <cublas_v2.h>

#include <algorithm>

#include "backend/cuda/linear/linear.h"
#include "backend/cuda/core/kernel_setup.h"
#include "backend/cuda/linear/linear_host.cuh"
#include "backend/cuda/linear/sm90_decode.cuh"
#include "backend/cuda/linear/sm90_nvfp4.cuh"

namespace cm::cuda {

namespace {

struct DecodeParams {
  const uint4* w;
  const uint16_t* s;
  int64_t chunks;
  int N, K, row_blocks;
  int rows_per_group;
  const __nv_bfloat16* x;
  int64_t ldx;
  int M;
  void* y;
  int64_t ldy;
  int y_bf16;
  float out_scale;
  int ksplit;
  int chunks_per_split;
  float* partials;
  unsigned* counters;
};

// How the NVFP4 decode kernel (sm90_decode.cuh) reads a K chunk: one 16-byte word of E2M1 codes per
// lane (512 bytes a 16-row chunk) and its 16-bit scale pair, expanded by chunk_mma (sm90_nvfp4.cuh).
struct Nvfp4Format {
  using Params = DecodeParams;
  template <int MT, bool PIPE>
  static constexpr int kUnroll = MT == 1 ? 4 : 2;
  static constexpr const char* kName = "nvfp4_decode_kernel";
  static constexpr const char* kPairName = "nvfp4_decode_pair_kernel";
  struct Block {
    const uint4* wb[1];
    const uint16_t* sb[1];
  };
  static __device__ __forceinline__ void prefetch(const Params& p, int64_t u0, int64_t n) {
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p.w + u0 * 32), "r"(uint32_t(n * 512)) : "memory");
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p.s + u0 * 32), "r"(uint32_t(n * 64)) : "memory");
  }
  static __device__ __forceinline__ Block block(const Params& p, int rb, int lane, int g, int t) {
    return Block{{p.w + int64_t(rb) * p.chunks * 32 + lane}, {p.s + int64_t(rb) * p.chunks * 32 + g * 4 + t}};
  }
  template <int MT, int U, bool PIPE>
  static __device__ __forceinline__ void kloop(const Block& b, const __nv_bfloat16* const (&xrow)[MT],
                                               const bool (&xok)[MT], int64_t c_first, int64_t c_end, int64_t cstep,
                                               int64_t K, int t, float (&acc)[MT][4]) {
    sm90::warp_kloop<MT, U, 1, PIPE>(b.wb, b.sb, xrow, xok, c_first, c_end, cstep, K, t,
                                     *reinterpret_cast<float(*)[1][MT][4]>(&acc));
  }
  static constexpr bool kScaledOutput = true;
  static __device__ __forceinline__ float out_scale(const Params& p) { return p.out_scale; }
  static const int (&occupancy(Context& ctx))[3] { return ctx.setup().nvfp4_decode_occupancy; }
};

// Expands rows [row0, row0+rows) (row0 % 16 == 0) to bf16 [rows, K], exact.
__global__ void nvfp4_dequant_kernel(const uint4* w, const uint16_t* s, int64_t chunks, int N, int K, int64_t rb0,
                                     int64_t row_blocks, int64_t row0, __nv_bfloat16* out, float post) {
  using namespace sm90;
  const int64_t unit = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (unit >= row_blocks * chunks) return;
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int64_t rb = rb0 + unit / chunks, c = unit % chunks;
  const uint4 wv = w[(rb * chunks + c) * 32 + lane];
  const uint32_t sv = s[(rb * chunks + c) * 32 + g * 4 + t];
  uint32_t sg, sg8;
  decode_scales(sv, sg, sg8);
  const uint32_t ws[4] = {wv.x, wv.y, wv.z, wv.w};
  uint32_t r0[8], r1[8];
  const __nv_bfloat162 k2 = __float2bfloat162_rn(post);
  const uint32_t kpost = *reinterpret_cast<const uint32_t*>(&k2);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    uint32_t a[4];
    expand_word(ws[j], sg, sg8, a);
    r0[2 * j] = bf16x2_mul(a[0], kpost);
    r0[2 * j + 1] = bf16x2_mul(a[2], kpost);
    r1[2 * j] = bf16x2_mul(a[1], kpost);
    r1[2 * j + 1] = bf16x2_mul(a[3], kpost);
  }
  const int64_t k = c * 64 + 16 * t;
  if (k >= K) return;
  const int64_t n0 = rb * 16 + g, n1 = n0 + 8;
  if (n0 < N) {
    uint4* o = reinterpret_cast<uint4*>(out + (n0 - row0) * int64_t(K) + k);
    o[0] = make_uint4(r0[0], r0[1], r0[2], r0[3]);
    o[1] = make_uint4(r0[4], r0[5], r0[6], r0[7]);
  }
  if (n1 < N) {
    uint4* o = reinterpret_cast<uint4*>(out + (n1 - row0) * int64_t(K) + k);
    o[0] = make_uint4(r1[0], r1[1], r1[2], r1[3]);
    o[1] = make_uint4(r1[4], r1[5], r1[6], r1[7]);
  }
}

// Cheap integer hash for on-device random weights.
__device__ __forceinline__ uint32_t hash32(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return uint32_t(x);
}

__global__ void random_fill_kernel(uint32_t* data, int64_t words, uint16_t* scales, int64_t scale_words, uint64_t seed) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < words; i += stride)
    data[i] = hash32(seed * 0x9E3779B97F4A7C15ULL + uint64_t(i));
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < scale_words; i += stride) {
    const uint32_t h = hash32(~seed + uint64_t(i) * 0x632BE59BD9B4E019ULL);
    // encoded scales around 2^-1 .. 2^2 (exponent field 8..11), any mantissa
    const uint32_t b0 = ((8 + (h & 3)) << 3) | ((h >> 2) & 7), b1 = ((8 + ((h >> 5) & 3)) << 3) | ((h >> 7) & 7);
    scales[i] = uint16_t(b0 | (b1 << 8));
  }
}

DecodeParams decode_params(const DeviceLinear& w, const uint16_t* x, int64_t M, int64_t ldx, void* y, int64_t ldy,
                           OutType out) {
  DecodeParams p{};
  p.w = w.data.as<const uint4>();
  p.s = w.scales.as<const uint16_t>();
  p.chunks = w.chunks;
  p.N = int(w.N);
  p.K = int(w.K);
  p.row_blocks = int(w.row_blocks);
  p.rows_per_group = int(w.N / w.groups);
  p.x = reinterpret_cast<const __nv_bfloat16*>(x);
  p.ldx = ldx;
  p.M = int(M);
  p.y = y;
  p.ldy = ldy;
  p.y_bf16 = out == OutType::BF16;
  p.out_scale = kEpilogueFactor * w.scale_2;
  return p;
}

}  // namespace

void setup_nvfp4_decode_kernels(KernelSetup& s) {
  decode_occupancy<Nvfp4Format>(s.nvfp4_decode_occupancy);
}

DeviceLinear upload_nvfp4(const LinearWeight& w, int groups) {
  Nvfp4Packed p = pack_nvfp4(w);
  check_upload_shape(w.name.c_str(), p.N, p.K, groups);
  DeviceLinear d;
  d.name = w.name;
  d.N = p.N;
  d.K = p.K;
  d.row_blocks = p.row_blocks;
  d.chunks = p.chunks;
  d.groups = groups;
  d.scale_2 = p.scale_2;
  d.data.alloc(p.data.size());
  d.data.upload(p.data.data(), p.data.size());
  d.scales.alloc(p.scales.size());
  d.scales.upload(p.scales.data(), p.scales.size());
  return d;
}

DeviceLinear random_nvfp4(int64_t N, int64_t K, uint64_t seed, int groups) {
  CM_CU_CHECK(N > 0 && K > 0 && K % 16 == 0, "random_nvfp4: bad shape %lldx%lld", (long long)N, (long long)K);
  DeviceLinear d;
  d.name = "random";
  d.N = N;
  d.K = K;
  d.row_blocks = (N + 15) / 16;
  d.chunks = (K + 63) / 64;
  d.groups = groups;
  d.scale_2 = 1.0f / 64.0f;
  d.data.alloc(size_t(d.row_blocks * d.chunks) * 512);
  d.scales.alloc(size_t(d.row_blocks * d.chunks) * 64);
  fill_random_packed(d.data.get(), d.data.size(), d.scales.get(), d.scales.size(), seed);
  return d;
}

void fill_random_packed(void* data, size_t data_bytes, void* scales, size_t scale_bytes, uint64_t seed) {
  random_fill_kernel<<<1024, 256>>>(static_cast<uint32_t*>(data), int64_t(data_bytes / 4), static_cast<uint16_t*>(scales),
                                    int64_t(scale_bytes / 2), seed);
  CM_CUDA_LAUNCH("random_fill_kernel");
  CM_CUDA(cudaDeviceSynchronize());
}

void dequant_nvfp4_bf16(Context& ctx, const DeviceLinear& w, int64_t row0, int64_t rows, uint16_t* out,
                        bool apply_scale_2) {
  CM_CU_CHECK(row0 % 16 == 0 && row0 >= 0 && row0 + rows <= w.N, "dequant_nvfp4_bf16: bad row range");
  const int64_t rb0 = row0 / 16, nrb = (rows + 15) / 16;
  const int64_t units = nrb * w.chunks;
  const float post = kEpilogueFactor * (apply_scale_2 ? w.scale_2 : 1.0f);
  nvfp4_dequant_kernel<<<unsigned((units + 7) / 8), 256, 0, ctx.stream()>>>(
      w.data.as<const uint4>(), w.scales.as<const uint16_t>(), w.chunks, int(std::min(w.N, row0 + rows)), int(w.K),
      rb0, nrb, row0, reinterpret_cast<__nv_bfloat16*>(out), post);
  CM_CUDA_LAUNCH("nvfp4_dequant_kernel");
}

// Auto's choice for M > decode_max_m, from the H200 measurements in
// docs/performance.md: the wgmma kernel reads 0.56 bytes per weight where the
// BF16 panel path moves ~4.6 (read packed, write and re-read BF16), so it wins
// while the weight stream matters: large weights (>= 2^25 elements: wq_b, wo_a,
// wo_b, the head) at M <= 256 (measured 1.2-1.4x faster there; at M = 512 it
// ties or loses). At larger M, or for smaller weights, cuBLAS's GEMM on the
// panel is faster than our wgmma mainloop (0.6-0.74x of cuBLAS at M = 4096).
bool auto_uses_wgmma(const DeviceLinear& w, int64_t M) {
  return wgmma_nvfp4_supported(w, M) && M <= 256 && w.N * w.K * w.groups >= (int64_t(1) << 25);
}

// The mma.sync prefill path's kernel: the exact wgmma kernel from kNvfp4ExactWgmmaMinRows rows where it
// takes the weight (the same bits either way; a speed choice).
bool tiles_use_exact_wgmma(Context& ctx, const DeviceLinear& w, int64_t M) {
  return M >= kNvfp4ExactWgmmaMinRows && exact_wgmma_nvfp4_unsupported(ctx, w, M) == nullptr;
}

const char* linear_nvfp4_path(const DeviceLinear& w, int64_t M, int64_t decode_max_m, PrefillKernel prefill,
                              Context* ctx) {
  if (M <= decode_max_m) return "mma.sync decode";
  if (prefill == PrefillKernel::MmaTiles) return ctx && tiles_use_exact_wgmma(*ctx, w, M) ? "wgmma exact" : "mma.sync prefill";
  if (prefill == PrefillKernel::Wgmma || (prefill == PrefillKernel::Auto && auto_uses_wgmma(w, M))) return "wgmma";
  return "dequant+cuBLAS";
}

bool linear_nvfp4_pair(Context& ctx, const DeviceLinear& wa, const DeviceLinear& wb, const uint16_t* x, int64_t M,
                       int64_t ldx, void* ya, int64_t ldya, void* yb, int64_t ldyb, OutType out) {
  return decode_pair(ctx, wa, wb, x, M, ldx, ldya, ldyb, [&](auto mt) {
    return launch_decode_pair<Nvfp4Format, decltype(mt)::value>(ctx, decode_params(wa, x, M, ldx, ya, ldya, out),
                                                                decode_params(wb, x, M, ldx, yb, ldyb, out));
  });
}

void linear_nvfp4(Context& ctx, const DeviceLinear& w, const uint16_t* x, int64_t M, int64_t ldx, void* y, int64_t ldy,
                  OutType out, int64_t decode_max_m, PrefillKernel prefill) {
  CM_CU_CHECK(ldx >= w.groups * w.K && ldy >= w.N, "linear '%s': leading dimensions too small", w.name.c_str());
  CM_CU_CHECK((ldx % 8) == 0 && (reinterpret_cast<uintptr_t>(x) % 16) == 0,
              "linear '%s': activations must be 16-byte aligned rows", w.name.c_str());
  if (M <= 0) return;
  if (M <= decode_max_m) {
    decode_in_slices(x, M, ldx, y, ldy, out, [&](auto mt, const uint16_t* xs, int64_t mm, void* ys) {
      launch_decode<Nvfp4Format, decltype(mt)::value>(ctx, decode_params(w, xs, mm, ldx, ys, ldy, out));
    });
    return;
  }
  if (prefill == PrefillKernel::MmaTiles) {
    if (tiles_use_exact_wgmma(ctx, w, M))
      linear_nvfp4_exact_wgmma(ctx, w, x, M, ldx, y, ldy, out);
    else
      linear_nvfp4_tiles(ctx, w, x, M, ldx, y, ldy, out);
    return;
  }
  if (prefill == PrefillKernel::Wgmma || (prefill == PrefillKernel::Auto && auto_uses_wgmma(w, M))) {
    linear_nvfp4_wgmma(ctx, w, x, M, ldx, y, ldy, out);
    return;
  }
  // Prefill: exact bf16 panels through cuBLAS (alpha = scale_2).
  prefill_bf16_panels(
      ctx, w.name.c_str(), w.N, w.K, w.groups, x, M, ldx, y, ldy, out, w.scale_2,
      [&](int64_t row0, int64_t rows, uint16_t* panel) { dequant_nvfp4_bf16(ctx, w, row0, rows, panel, false); });
}

}  // namespace cm::cuda
