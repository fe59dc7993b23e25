// NVFP4 linear on the GPU against the CPU reference (linear_cpu) on fresh
// random weights and activations: V4-Flash's real shapes and odd small ones,
// decode (mma.sync) and prefill (dequant + cuBLAS) paths, BF16 and FP32
// outputs, grouped wo_a. Bounds and canaries: linear_check.h.
#include <gtest/gtest.h>

#include <cstring>

#include "backend/cuda/cuda_linear.h"
#include "backend/cuda/nvfp4_pack.h"
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

void run_case(cuda::Context& ctx, const Case& c, uint64_t seed) {
  const int64_t KX = c.K * c.groups;
  LinearWeight w = random_nvfp4(c.N, c.K, seed);
  cuda::DeviceLinear dw = cuda::upload_nvfp4(w, c.groups);
  // device bytes stay the stored size, up to padding of N to 16 and K to 64
  const double stored = double(c.N * c.K) / 2 + double(c.N * c.K) / 16;
  const double padded = double((c.N + 15) / 16 * 16) * double((c.K + 63) / 64 * 64) * (0.5 + 1.0 / 16);
  EXPECT_LE(double(dw.device_bytes()), padded + 1);
  EXPECT_GE(double(dw.device_bytes()), stored);
  for (int64_t M : c.ms) {
    SCOPED_TRACE(testing::Message() << "N=" << c.N << " K=" << c.K << " groups=" << c.groups << " M=" << M);
    std::vector<uint16_t> xb;
    std::vector<float> xf;
    random_bf16(size_t(M * KX), seed * 31 + uint64_t(M), 2.0f, xb, xf);
    cuda::DeviceBuffer dx(xb.size() * 2);
    dx.upload(xb.data(), xb.size() * 2);
    gputest::check_linear_outputs(M, c.N, gputest::reference_linear(w, c.groups, xf, M),
                                  [&](void* y, int64_t ldy, cuda::OutType ot) {
                                    cuda::linear_nvfp4(ctx, dw, dx.as<const uint16_t>(), M, KX, y, ldy, ot);
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

TEST(GpuNvfp4Linear, FlashHeadShape) {
  CM_SKIP_WITHOUT_GPU();
  cuda::Context ctx;
  run_case(ctx, Case{129280, 4096, 1, {1, 2}}, 99);
}

}  // namespace
}  // namespace cm
