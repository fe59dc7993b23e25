// NVFP4 linear on the GPU against the CPU reference (linear_cpu) on fresh
// random weights and activations: V4-Flash's real shapes and odd small ones,
// decode (mma.sync) and prefill (dequant + cuBLAS) paths, BF16 and FP32
// outputs, grouped wo_a. Bounds and canaries: linear_check.h.
#include <gtest/gtest.h>

#include <cstring>

#include "backend/cuda/linear/linear.h"
#include "backend/cuda/linear/nvfp4_pack.h"
#include "common/error.h"
#include "gpu_test_util.h"
#include "linear_check.h"

namespace cm {
namespace {

using gputest::random_bf16;
using gputest::random_nvfp4;

struct Case {
  int64_t N, K;
  int groups;
  std::vector<int64_t> ms;
};

void run_case(cuda::Context& ctx, const Case& c, uint64_t seed,
              cuda::PrefillKernel prefill = cuda::PrefillKernel::Auto, int64_t decode_max_m = 64) {
  const int64_t KX = c.K * c.groups;
  LinearWeight w = random_nvfp4(c.N, c.K, seed);
  cuda::DeviceLinear dw = cuda::upload_nvfp4(w, c.groups);
  // device bytes stay the stored size, up to padding of N to 16 and K to 64
  const double stored = double(c.N * c.K) / 2 + double(c.N * c.K) / 16;
  const double padded = double((c.N + 15) / 16 * 16) * double((c.K + 63) / 64 * 64) * (0.5 + 1.0 / 16);
  EXPECT_LE(double(dw.device_bytes()), padded + 1);
  EXPECT_GE(double(dw.device_bytes()), stored);
  for (int64_t M : c.ms) {
    SCOPED_TRACE(testing::Message() << "N=" << c.N << " K=" << c.K << " groups=" << c.groups << " M=" << M
                                    << " path=" << cuda::linear_nvfp4_path(dw, M, decode_max_m, prefill));
    std::vector<uint16_t> xb;
    std::vector<float> xf;
    random_bf16(size_t(M * KX), seed * 31 + uint64_t(M), 2.0f, xb, xf);
    cuda::DeviceBuffer dx(xb.size() * 2);
    dx.upload(xb.data(), xb.size() * 2);
    gputest::check_linear_outputs(M, c.N, gputest::reference_linear(w, c.groups, xf, M),
                                  [&](void* y, int64_t ldy, cuda::OutType ot) {
                                    cuda::linear_nvfp4(ctx, dw, dx.as<const uint16_t>(), M, KX, y, ldy, ot,
                                                       decode_max_m, prefill);
                                  });
  }
}

TEST(GpuNvfp4Linear, PackedLayoutReproducesEveryWeight) {
  // Host-only: the repacked bytes decode to exactly linear_expand_row's values.
  for (auto [N, K] : {std::pair<int64_t, int64_t>{40, 80}, {16, 64}, {33, 1008}}) {
    LinearWeight w = random_nvfp4(N, K, uint64_t(N * 7 + K));
    cuda::Nvfp4Packed p = cuda::pack_nvfp4(w);
    std::vector<float> row(static_cast<size_t>(K));
    for (int64_t n = 0; n < N; ++n) {
      linear_expand_row(w, n, row.data());
      for (int64_t k = 0; k < K; ++k)
        ASSERT_EQ(cuda::packed_nvfp4_value(p, n, k), row[size_t(k)]) << "n=" << n << " k=" << k;
    }
  }
}

TEST(GpuNvfp4Linear, RejectsNaNScale) {
  LinearWeight w = random_nvfp4(16, 64, 3);
  w.owned_scale[5] = 0x7f;
  EXPECT_THROW(cuda::pack_nvfp4(w), Error);
}

TEST(GpuNvfp4Linear, OddSmallShapes) {
  CM_SKIP_WITHOUT_GPU();
  cuda::Context ctx;
  const std::vector<int64_t> ms = {1, 2, 7, 8, 9, 16, 17, 31, 40, 64, 65, 100};
  for (const Case& c : {Case{16, 16, 1, ms}, Case{3, 64, 1, ms}, Case{17, 48, 1, ms}, Case{40, 80, 1, ms},
                        Case{100, 1008, 1, ms}, Case{64, 4096, 2, ms},
                        // >= 8 row blocks per SM: the unsplit plain-loop variant, ragged N and K
                        Case{16900, 80, 1, {1, 9, 20}}})
    run_case(ctx, c, uint64_t(c.N * 131 + c.K));
}

TEST(GpuNvfp4Linear, FlashExpertAndAttentionShapes) {
  CM_SKIP_WITHOUT_GPU();
  cuda::Context ctx;
  const std::vector<int64_t> ms = {1, 4, 16, 33, 80};
  for (const Case& c : {Case{2048, 4096, 1, ms}, Case{4096, 2048, 1, ms}, Case{1024, 4096, 1, ms},
                        Case{32768, 1024, 1, {1, 5, 70}}, Case{512, 4096, 1, ms}, Case{8192, 4096, 8, {1, 3, 70}},
                        Case{4096, 8192, 1, {1, 9, 70}}})
    run_case(ctx, c, uint64_t(c.N + c.K * 3));
}

// The prefill kernels on their own: the wgmma kernel (token tiles of 64, 128
// and 256, with and without split-K, ragged M, N and K, grouped wo_a) and
// dequant + cuBLAS; the wgmma kernel also below M = 64 (64-token tiles, split-K).
TEST(GpuNvfp4Linear, PrefillWgmmaAndCublas) {
  CM_SKIP_WITHOUT_GPU();
  cuda::Context ctx;
  const std::vector<int64_t> ms = {65, 128, 129, 255, 300};
  for (auto pk : {cuda::PrefillKernel::Wgmma, cuda::PrefillKernel::DequantCublas}) {
    for (const Case& c : {Case{16, 16, 1, ms}, Case{3, 64, 1, {65, 70}}, Case{100, 1008, 1, ms},
                          Case{130, 80, 1, ms}, Case{2048, 4096, 1, {300, 1000}}, Case{4096, 2048, 1, {257}},
                          Case{512, 4096, 1, {130}}, Case{8192, 4096, 8, {140}}, Case{4096, 8192, 1, {129}},
                          Case{16900, 80, 1, {200}}, Case{32768, 1024, 1, {600}}, Case{10000, 192, 1, {250}}})
      run_case(ctx, c, uint64_t(c.N * 7 + c.K + int(pk)), pk);
  }
  for (const Case& c : {Case{40, 80, 1, {1, 9, 64}}, Case{2048, 4096, 1, {1, 16, 64}}, Case{8192, 4096, 8, {3}}})
    run_case(ctx, c, uint64_t(c.N + c.K), cuda::PrefillKernel::Wgmma, 0);
}

TEST(GpuNvfp4Linear, PrefillDispatch) {
  LinearWeight w = random_nvfp4(64, 4096, 5);
  CM_SKIP_WITHOUT_GPU();
  cuda::Context ctx;
  // rows per group (32) below the wgmma tile: Auto takes cuBLAS, forcing wgmma is refused
  cuda::DeviceLinear grouped = cuda::upload_nvfp4(w, 2);
  EXPECT_STREQ(cuda::linear_nvfp4_path(grouped, 100), "dequant+cuBLAS");
  EXPECT_STREQ(cuda::linear_nvfp4_path(grouped, 64), "mma.sync decode");
  cuda::DeviceBuffer x(size_t(100 * 8192) * 2), y(size_t(100 * 64) * 4);
  EXPECT_THROW(cuda::linear_nvfp4(ctx, grouped, x.as<const uint16_t>(), 100, 8192, y.get(), 64, cuda::OutType::F32, 64,
                                  cuda::PrefillKernel::Wgmma),
               Error);
  run_case(ctx, Case{64, 4096, 2, {100}}, 11);
  cuda::DeviceLinear plain = cuda::upload_nvfp4(w, 1);
  // Auto: wgmma for large weights up to M = 256, dequant + cuBLAS otherwise
  EXPECT_STREQ(cuda::linear_nvfp4_path(plain, 65), "dequant+cuBLAS");
  EXPECT_STREQ(cuda::linear_nvfp4_path(plain, 65, 64, cuda::PrefillKernel::Wgmma), "wgmma");
  cuda::DeviceLinear big = cuda::random_nvfp4(8192, 4096, 9);
  EXPECT_STREQ(cuda::linear_nvfp4_path(big, 65), "wgmma");
  EXPECT_STREQ(cuda::linear_nvfp4_path(big, 256), "wgmma");
  EXPECT_STREQ(cuda::linear_nvfp4_path(big, 257), "dequant+cuBLAS");
  EXPECT_STREQ(cuda::linear_nvfp4_path(big, 257, 512), "mma.sync decode");
}

// Back-to-back decode linears where the second reads the first's output: with
// programmatic dependent launch the second kernel starts early, so its reads
// of x must wait (griddepcontrol.wait). The intermediate buffer starts as NaN
// each round: an early read would show up as non-finite or wrong outputs.
TEST(GpuNvfp4Linear, ChainedLaunchesSeeEarlierOutputs) {
  CM_SKIP_WITHOUT_GPU();
  for (bool pdl : {true, false}) {
    cuda::Context ctx(0, pdl);
    const int64_t M = 5, K1 = 4096, N1 = 2048, N2 = 4096;
    LinearWeight w1 = random_nvfp4(N1, K1, 71), w2 = random_nvfp4(N2, N1, 72);
    cuda::DeviceLinear d1 = cuda::upload_nvfp4(w1), d2 = cuda::upload_nvfp4(w2);
    std::vector<uint16_t> xb;
    std::vector<float> xf;
    random_bf16(size_t(M * K1), 73, 2.0f, xb, xf);
    std::vector<float> h(size_t(M * N1)), ref(size_t(M * N2));
    linear_cpu(w1, xf.data(), M, h.data());
    std::vector<float> hb(h.size());
    for (size_t i = 0; i < h.size(); ++i) hb[i] = bf16_to_f32(f32_to_bf16(h[i]));
    linear_cpu(w2, hb.data(), M, ref.data());
    cuda::DeviceBuffer dx(xb.size() * 2), dh(h.size() * 2), dy(ref.size() * 4);
    dx.upload(xb.data(), xb.size() * 2);
    for (int round = 0; round < 20; ++round) {
      CM_CUDA(cudaMemsetAsync(dh.get(), 0xFF, dh.size(), ctx.stream()));  // bf16 NaN
      cuda::linear_nvfp4(ctx, d1, dx.as<const uint16_t>(), M, K1, dh.get(), N1, cuda::OutType::BF16);
      cuda::linear_nvfp4(ctx, d2, dh.as<const uint16_t>(), M, N1, dy.get(), N2, cuda::OutType::F32);
      ctx.sync();
      std::vector<float> y(ref.size());
      dy.download(y.data(), y.size() * 4);
      int64_t nonfinite = 0;
      // h is rounded to bf16 on both sides; the fp32 sums before that rounding may differ in the last bit
      EXPECT_LE(gputest::rel_error(y, ref, &nonfinite), 2e-3) << "pdl=" << pdl << " round " << round;
      ASSERT_EQ(nonfinite, 0) << "pdl=" << pdl << " round " << round;
    }
  }
}

TEST(GpuNvfp4Linear, FlashHeadShape) {
  CM_SKIP_WITHOUT_GPU();
  cuda::Context ctx;
  run_case(ctx, Case{129280, 4096, 1, {1, 2}}, 99);
}

}  // namespace
}  // namespace cm
