// FP8 128x128-block linear on the GPU against the CPU reference (linear_cpu
// via linear_check.h) on fresh random weights (tests/release_weights.h: all
// non-NaN E4M3 codes incl. subnormals) and activations: V4-Flash's FP8
// attention shapes, grouped wo_a, and odd shapes (N not a multiple of 16 or
// 128, K not a multiple of 64 or 128); M from 1 to 300 so the decode kernel
// (all MT variants, split and unsplit), the exact bf16 + cuBLAS prefill
// (power-of-two scales) and the decode-slice prefill (other F32 scales) all
// run, and each call reports the expected path. Bounds and canaries:
// linear_check.h (1e-5 FP32 output, 1e-2 BF16 output). Also: the bf16
// dequant panel is bit-exact against the CPU expansion, and split-K decode is
// deterministic (same bits on repeated calls).
#include <gtest/gtest.h>

#include <cstring>

#include "../release_weights.h"
#include "backend/cuda/linear/linear.h"
#include "common/error.h"
#include "gpu_test_util.h"
#include "linear_check.h"

namespace cm {
namespace {

using gputest::random_bf16;
using testw::Fp8Scales;
using testw::random_fp8;

struct Case {
  int64_t N, K;
  int groups;
  std::vector<int64_t> ms;
};

const char* expected_path(int64_t M, Fp8Scales s) {
  if (M <= 64) return cuda::kFp8PathDecode;
  return s == Fp8Scales::F32_ANY ? cuda::kFp8PathSlices : cuda::kFp8PathCublas;
}

void run_case(cuda::Context& ctx, const Case& c, Fp8Scales scales, uint64_t seed) {
  const int64_t KX = c.K * c.groups;
  LinearWeight w = random_fp8(c.N, c.K, seed, scales);
  cuda::DeviceFp8Linear dw = cuda::upload_fp8(w, c.groups);
  EXPECT_EQ(dw.pow2_scales, scales != Fp8Scales::F32_ANY);
  // device bytes: one byte per weight up to padding of N to 16 and K to 64, plus f32 block scales
  const int64_t padded = (c.N + 15) / 16 * 16 * ((c.K + 63) / 64 * 64);
  EXPECT_EQ(int64_t(dw.data.size()), padded);
  EXPECT_EQ(int64_t(dw.scales.size()), (c.N + 127) / 128 * ((c.K + 127) / 128) * 4);
  for (int64_t M : c.ms) {
    SCOPED_TRACE(testing::Message() << "N=" << c.N << " K=" << c.K << " groups=" << c.groups << " M=" << M
                                    << " scales=" << int(scales));
    std::vector<uint16_t> xb;
    std::vector<float> xf;
    random_bf16(size_t(M * KX), seed * 31 + uint64_t(M), 2.0f, xb, xf);
    cuda::DeviceBuffer dx(xb.size() * 2);
    dx.upload(xb.data(), xb.size() * 2);
    const char* path = nullptr;
    gputest::check_linear_outputs(M, c.N, gputest::reference_linear(w, c.groups, xf, M),
                                  [&](void* y, int64_t ldy, cuda::OutType ot) {
                                    path = cuda::linear_fp8(ctx, dw, dx.as<const uint16_t>(), M, KX, y, ldy, ot);
                                  });
    EXPECT_STREQ(path, expected_path(M, scales));
  }
}

const std::vector<int64_t> kMs = {1, 3, 16, 64, 65, 300};

TEST(GpuFp8Linear, OddShapes) {
  CM_SKIP_WITHOUT_GPU();
  cuda::Context ctx;
  const std::vector<int64_t> ms = {1, 2, 7, 8, 9, 16, 17, 31, 33, 64, 65, 100, 300};
  for (Fp8Scales s : {Fp8Scales::E8M0, Fp8Scales::F32_POW2, Fp8Scales::F32_ANY})
    for (const Case& c : {Case{16, 16, 1, ms}, Case{3, 64, 1, ms}, Case{200, 336, 1, ms}, Case{130, 272, 1, ms},
                          Case{300, 1040, 1, ms}, Case{160, 208, 2, ms},
                          // >= 8 row blocks per SM: the unsplit plain-loop variant, ragged N and K
                          Case{16900, 208, 1, {1, 9, 20, 65}}})
      run_case(ctx, c, s, uint64_t(c.N * 131 + c.K + int(s)));
}

TEST(GpuFp8Linear, FlashAttentionShapesE8M0) {
  CM_SKIP_WITHOUT_GPU();
  cuda::Context ctx;
  for (const Case& c : {Case{1024, 4096, 1, kMs}, Case{32768, 1024, 1, kMs}, Case{512, 4096, 1, kMs},
                        Case{8192, 4096, 8, kMs}, Case{4096, 8192, 1, kMs}})
    run_case(ctx, c, Fp8Scales::E8M0, uint64_t(c.N + c.K * 3));
}

TEST(GpuFp8Linear, FlashAttentionShapesF32Scales) {
  CM_SKIP_WITHOUT_GPU();
  cuda::Context ctx;
  for (Fp8Scales s : {Fp8Scales::F32_ANY, Fp8Scales::F32_POW2})
    for (const Case& c : {Case{1024, 4096, 1, {1, 16, 65}}, Case{8192, 4096, 8, {3, 64, 65}},
                          Case{4096, 8192, 1, {1, 65}}, Case{32768, 1024, 1, {3, 65}}})
      run_case(ctx, c, s, uint64_t(c.N * 7 + c.K + int(s)));
}

TEST(GpuFp8Linear, DequantPanelIsBitExact) {
  CM_SKIP_WITHOUT_GPU();
  cuda::Context ctx;
  for (auto [N, K] : {std::pair<int64_t, int64_t>{200, 336}, {256, 1024}}) {
    LinearWeight w = random_fp8(N, K, uint64_t(N + K), Fp8Scales::E8M0);
    cuda::DeviceFp8Linear dw = cuda::upload_fp8(w);
    const int64_t row0 = 32, rows = N - row0;
    cuda::DeviceBuffer panel(size_t(rows * K) * 2);
    cuda::dequant_fp8_bf16(ctx, dw, row0, rows, panel.as<uint16_t>());
    ctx.sync();
    std::vector<uint16_t> got(size_t(rows * K));
    panel.download(got.data(), got.size() * 2);
    std::vector<float> row(static_cast<size_t>(K));
    for (int64_t n = row0; n < N; ++n) {
      linear_expand_row(w, n, row.data());
      for (int64_t k = 0; k < K; ++k)
        ASSERT_EQ(bf16_to_f32(got[size_t((n - row0) * K + k)]), row[size_t(k)]) << "n=" << n << " k=" << k;
    }
  }
  LinearWeight f = random_fp8(64, 128, 3, Fp8Scales::F32_ANY);
  cuda::DeviceFp8Linear df = cuda::upload_fp8(f);
  cuda::DeviceBuffer panel(size_t(64 * 128) * 2);
  EXPECT_THROW(cuda::dequant_fp8_bf16(ctx, df, 0, 64, panel.as<uint16_t>()), Error);
}

TEST(GpuFp8Linear, SplitKDecodeIsDeterministic) {
  CM_SKIP_WITHOUT_GPU();
  cuda::Context ctx;
  LinearWeight w = random_fp8(1024, 4096, 5, Fp8Scales::F32_ANY);
  cuda::DeviceFp8Linear dw = cuda::upload_fp8(w);
  for (int64_t M : {1, 16, 32}) {
    std::vector<uint16_t> xb;
    std::vector<float> xf;
    random_bf16(size_t(M * 4096), 9 + uint64_t(M), 2.0f, xb, xf);
    cuda::DeviceBuffer dx(xb.size() * 2), dy(size_t(M * 1024) * 4);
    dx.upload(xb.data(), xb.size() * 2);
    std::vector<float> first(size_t(M * 1024)), again(first.size());
    for (int rep = 0; rep < 3; ++rep) {
      cuda::linear_fp8(ctx, dw, dx.as<const uint16_t>(), M, 4096, dy.get(), 1024, cuda::OutType::F32);
      ctx.sync();
      dy.download((rep == 0 ? first : again).data(), first.size() * 4);
      if (rep > 0) {
        ASSERT_EQ(std::memcmp(first.data(), again.data(), first.size() * 4), 0) << "M=" << M;
      }
    }
  }
}

TEST(GpuFp8Linear, UploadRejectsBadGroups) {
  // Host-side checks, before any device allocation.
  LinearWeight w = random_fp8(160, 64, 1, Fp8Scales::E8M0, "layers.0.attn.wo_a");
  try {
    cuda::upload_fp8(w, 3);  // 160 rows are not 3 groups of whole 16-row blocks
    FAIL() << "expected cm::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layers.0.attn.wo_a"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace cm
