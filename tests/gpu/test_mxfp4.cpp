// MXFP4 (DeepSeek's release expert format, spec 9.3) on the GPU through the
// unchanged NVFP4 kernels after the host repack (pack_mxfp4): the linear at
// V4-Flash's expert shapes and odd ones against linear_cpu (bounds and
// canaries: linear_check.h), the bf16 dequant panel bit-exact against the CPU
// expansion (values are powers of two times E2M1, so nothing may round), and
// the grouped MoE with MXFP4 experts against the CPU reference of
// moe_check.h. Scales span up to the 32 binades the packed byte holds.
#include <gtest/gtest.h>

#include "../release_weights.h"
#include "backend/cuda/linear/linear.h"
#include "backend/cuda/moe/moe.h"
#include "gpu_test_util.h"
#include "linear_check.h"
#include "moe_check.h"

namespace cm {
namespace {

using gputest::random_bf16;
using testw::random_mxfp4;

struct Case {
  int64_t N, K;
  int e_lo, e_hi;
  std::vector<int64_t> ms;
};

void run_case(cuda::Context& ctx, const Case& c, uint64_t seed) {
  LinearWeight w = random_mxfp4(c.N, c.K, seed, c.e_lo, c.e_hi);
  cuda::DeviceLinear dw = cuda::upload_nvfp4(w);
  for (int64_t M : c.ms) {
    SCOPED_TRACE(testing::Message() << "N=" << c.N << " K=" << c.K << " exponents " << c.e_lo << ".." << c.e_hi
                                    << " M=" << M);
    std::vector<uint16_t> xb;
    std::vector<float> xf;
    random_bf16(size_t(M * c.K), seed * 17 + uint64_t(M), 2.0f, xb, xf);
    cuda::DeviceBuffer dx(xb.size() * 2);
    dx.upload(xb.data(), xb.size() * 2);
    gputest::check_linear_outputs(M, c.N, gputest::reference_linear(w, 1, xf, M),
                                  [&](void* y, int64_t ldy, cuda::OutType ot) {
                                    cuda::linear_nvfp4(ctx, dw, dx.as<const uint16_t>(), M, c.K, y, ldy, ot);
                                  });
  }
}

TEST(GpuMxfp4Linear, FlashExpertShapes) {
  CM_SKIP_WITHOUT_GPU();
  cuda::Context ctx;
  const std::vector<int64_t> ms = {1, 3, 16, 64, 65, 300};
  run_case(ctx, Case{2048, 4096, 115, 124, ms}, 1);
  run_case(ctx, Case{4096, 2048, 115, 124, ms}, 2);
}

TEST(GpuMxfp4Linear, OddShapesAndWideExponentSpan) {
  CM_SKIP_WITHOUT_GPU();
  cuda::Context ctx;
  const std::vector<int64_t> ms = {1, 7, 9, 17, 33, 64, 65, 100};
  for (const Case& c : {Case{40, 96, 100, 131, ms}, Case{33, 1056, 110, 141, ms}, Case{200, 320, 127, 127, ms},
                        Case{16, 32, 120, 126, ms}})
    run_case(ctx, c, uint64_t(c.N * 3 + c.K));
}

TEST(GpuMxfp4Linear, DequantPanelIsBitExact) {
  CM_SKIP_WITHOUT_GPU();
  cuda::Context ctx;
  // 32 binades, the widest the layout holds; all values representable in bf16.
  LinearWeight w = random_mxfp4(200, 320, 11, 100, 131);
  cuda::DeviceLinear dw = cuda::upload_nvfp4(w);
  const int64_t N = 200, K = 320;
  cuda::DeviceBuffer panel(size_t(N * K) * 2);
  cuda::dequant_nvfp4_bf16(ctx, dw, 0, N, panel.as<uint16_t>(), true);
  ctx.sync();
  std::vector<uint16_t> got(size_t(N * K));
  panel.download(got.data(), got.size() * 2);
  std::vector<float> row(static_cast<size_t>(K));
  for (int64_t n = 0; n < N; ++n) {
    linear_expand_row(w, n, row.data());
    for (int64_t k = 0; k < K; ++k)
      ASSERT_EQ(bf16_to_f32(got[size_t(n * K + k)]), row[size_t(k)]) << "n=" << n << " k=" << k;
  }
}

gputest::Experts make_mxfp4_experts(int count, int64_t hidden, int64_t inter, uint64_t seed) {
  gputest::Experts e;
  for (int i = 0; i < count; ++i) {
    // w1/w3 around 2^-9 .. 2^-5 per block, w2 a little smaller, like trained experts
    e.w1.push_back(random_mxfp4(inter, hidden, seed + 3 * i, 118, 122));
    e.w3.push_back(random_mxfp4(inter, hidden, seed + 3 * i + 1, 118, 122));
    e.w2.push_back(random_mxfp4(hidden, inter, seed + 3 * i + 2, 117, 121));
  }
  return e;
}

// T tokens per entry of ts, ids drawn uniformly from [first - 2, first + count + 2):
// some land outside the local range and must contribute nothing. Each step runs
// on the automatic path and on the prefill kernels.
void run_moe(int64_t hidden, int64_t inter, int count, int first, int topk, float limit, std::initializer_list<int> ts,
             uint64_t seed) {
  cuda::Context ctx;
  gputest::Experts ex = make_mxfp4_experts(count, hidden, inter, seed);
  cuda::DeviceExperts dex =
      cuda::upload_experts(gputest::ptrs(ex.w1), gputest::ptrs(ex.w3), gputest::ptrs(ex.w2), first, limit);
  gputest::Rng r(seed + 1);
  for (int T : ts) {
    std::vector<int32_t> ids(size_t(T * topk));
    for (auto& id : ids) id = int32_t(first - 2 + int(r.next() % uint64_t(count + 4)));
    gputest::check_moe(ctx, ex, dex, hidden, inter, T, topk, ids, seed * 10 + uint64_t(T));
    // the prefill kernels on the same step (the repacked MXFP4 takes them too)
    gputest::check_moe(ctx, ex, dex, hidden, inter, T, topk, ids, seed * 10 + uint64_t(T), false, false,
                       cuda::MoePath::prefill);
  }
}

TEST(GpuMxfp4Moe, SmallShapes) {
  CM_SKIP_WITHOUT_GPU();
  run_moe(256, 128, 8, 4, 3, 1.0f, {1, 2, 5, 17, 40, 100}, 31);
}

TEST(GpuMxfp4Moe, FlashExpertShape) {
  CM_SKIP_WITHOUT_GPU();
  run_moe(4096, 2048, 8, 16, 6, 10.0f, {1, 4, 16}, 41);
}

}  // namespace
}  // namespace cm
