// Two decode linears of one input in one launch (linear_fp8_pair,
// linear_nvfp4_pair: q_a and kv at decode) against the two launches they
// replace — bit for bit, f32 and bf16 outputs — and against the CPU linear (linear_check.h's bounds:
// ||y − ref|| / ||ref|| <= 1e-5 f32, 1e-2 bf16). Shapes: V4-Flash's wq_a
// (1024 x 4096) and wkv (512 x 4096), the tiny fixture's, and odd ones (N not a
// multiple of 16, K not of 64); M = 1, 3, 17, 32 (the three MT variants). Outputs
// are Guarded (canaries, NaN-filled); a second pair launch gives the same bits
// (the split-K counters were reset). Also the cases it declines (M > 32,
// different K, grouped weights), having launched nothing; and that a bf16 output
// of the FP8/NVFP4 linears (every path run_linear takes) and of SwiGLU is the
// cast of their f32 output, bit for bit (wo_a and SwiGLU write bf16 for an
// FP8/NVFP4 consumer).
#include <gtest/gtest.h>

#include <cstring>

#include "../release_weights.h"
#include "backend/cuda/linear/linear.h"
#include "backend/cuda/step/step_kernels.h"
#include "common/error.h"
#include "gpu_test_util.h"
#include "linear_check.h"
#include "op_check.h"
#include "ops/swiglu.h"

namespace cm {
namespace {

using gputest::Guarded;
using gputest::Rng;
using testw::Fp8Scales;
using testw::random_fp8;

std::vector<float> as_f32(const std::vector<uint8_t>& raw, cuda::OutType ot) {
  std::vector<float> v(raw.size() / (ot == cuda::OutType::F32 ? 4 : 2));
  for (size_t i = 0; i < v.size(); ++i) {
    if (ot == cuda::OutType::F32) {
      std::memcpy(&v[i], &raw[4 * i], 4);
    } else {
      uint16_t b;
      std::memcpy(&b, &raw[2 * i], 2);
      v[i] = bf16_to_f32(b);
    }
  }
  return v;
}

// Runs the pair and the two single launches of linears a and b over random inputs and compares them.
// pair(x, M, ya, yb, ot) -> bool; single(k, x, M, y, ot) runs linear k (0: a, 1: b) alone.
template <class Pair, class Single>
void check_pair(cuda::Context& ctx, const LinearWeight& wa, const LinearWeight& wb, uint64_t seed, Pair&& pair,
                Single&& single) {
  const int64_t Na = wa.out_features, Nb = wb.out_features, K = wa.in_features;
  for (int64_t M : {1, 3, 17, 32}) {
    SCOPED_TRACE(testing::Message() << wa.name << " Na=" << Na << " Nb=" << Nb << " K=" << K << " M=" << M);
    std::vector<uint16_t> xb;
    std::vector<float> xf;
    gputest::random_bf16(size_t(M * K), seed * 7 + uint64_t(M), 2.0f, xb, xf);
    cuda::DeviceBuffer dx(xb.size() * 2);
    dx.upload(xb.data(), xb.size() * 2);
    const uint16_t* x = dx.as<const uint16_t>();
    const std::vector<float> ra = gputest::reference_linear(wa, 1, xf, M), rb = gputest::reference_linear(wb, 1, xf, M);
    for (cuda::OutType ot : {cuda::OutType::F32, cuda::OutType::BF16}) {
      const size_t es = ot == cuda::OutType::F32 ? 4 : 2;
      Guarded<uint8_t> ya(size_t(M * Na) * es), yb(size_t(M * Nb) * es);
      Guarded<uint8_t> sa(size_t(M * Na) * es), sb(size_t(M * Nb) * es);
      // These shapes are far below 8 row blocks per SM: both split, the pair always runs.
      EXPECT_TRUE(pair(x, M, ya.ptr(), yb.ptr(), ot));
      single(0, x, M, sa.ptr(), ot);
      single(1, x, M, sb.ptr(), ot);
      ctx.sync();
      const std::vector<uint8_t> ga = ya.get(), gb = yb.get();
      EXPECT_EQ(std::memcmp(ga.data(), sa.get().data(), ga.size()), 0) << "first linear, out " << es;
      EXPECT_EQ(std::memcmp(gb.data(), sb.get().data(), gb.size()), 0) << "second linear, out " << es;
      int64_t bad = 0;
      const double bound = ot == cuda::OutType::F32 ? 1e-5 : 1e-2;
      EXPECT_LE(gputest::rel_error(as_f32(ga, ot), ra, &bad), bound);
      EXPECT_LE(gputest::rel_error(as_f32(gb, ot), rb, &bad), bound);
      EXPECT_EQ(bad, 0);
    }
    // Again: the split-K counters were left at zero for the next launch (the same bits).
    Guarded<float> y1(size_t(M * Na)), y2(size_t(M * Nb)), s1(size_t(M * Na)), s2(size_t(M * Nb));
    ASSERT_TRUE(pair(x, M, y1.ptr(), y2.ptr(), cuda::OutType::F32));
    single(0, x, M, s1.ptr(), cuda::OutType::F32);
    single(1, x, M, s2.ptr(), cuda::OutType::F32);
    ctx.sync();
    const std::vector<float> g1 = y1.get(), g2 = y2.get();
    EXPECT_EQ(std::memcmp(g1.data(), s1.get().data(), g1.size() * 4), 0) << "first linear, second pair launch";
    EXPECT_EQ(std::memcmp(g2.data(), s2.get().data(), g2.size() * 4), 0) << "second linear, second pair launch";
  }
}

struct PairCase {
  int64_t Na, Nb, K;
};
// V4-Flash's wq_a and wkv, the tiny fixture's, odd ones.
const PairCase kPairCases[] = {{1024, 512, 4096}, {128, 64, 256}, {200, 72, 1008}, {16, 8, 64}};

TEST(GpuLinearPair, Fp8OneLaunchGivesEachLinearsOwnBits) {
  CM_SKIP_WITHOUT_GPU();
  cuda::Context ctx;
  uint64_t seed = 100;
  for (const PairCase& c : kPairCases) {
    const LinearWeight wa = random_fp8(c.Na, c.K, ++seed, Fp8Scales::E8M0, "test.fp8.wq_a");
    const LinearWeight wb = random_fp8(c.Nb, c.K, ++seed, Fp8Scales::F32_ANY, "test.fp8.wkv");
    const cuda::DeviceFp8Linear da = cuda::upload_fp8(wa), db = cuda::upload_fp8(wb);
    const cuda::DeviceFp8Linear* d[2] = {&da, &db};
    check_pair(
        ctx, wa, wb, seed,
        [&](const uint16_t* x, int64_t M, void* ya, void* yb, cuda::OutType ot) {
          return cuda::linear_fp8_pair(ctx, da, db, x, M, c.K, ya, c.Na, yb, c.Nb, ot);
        },
        [&](int k, const uint16_t* x, int64_t M, void* y, cuda::OutType ot) {
          cuda::linear_fp8(ctx, *d[k], x, M, c.K, y, d[k]->N, ot);
        });
  }
}

TEST(GpuLinearPair, Nvfp4OneLaunchGivesEachLinearsOwnBits) {
  CM_SKIP_WITHOUT_GPU();
  cuda::Context ctx;
  uint64_t seed = 200;
  for (const PairCase& c : kPairCases) {
    if (c.K % 16) continue;  // NVFP4 blocks of 16
    const LinearWeight wa = gputest::random_nvfp4(c.Na, c.K, ++seed), wb = gputest::random_nvfp4(c.Nb, c.K, ++seed, 0.5f);
    const cuda::DeviceLinear da = cuda::upload_nvfp4(wa), db = cuda::upload_nvfp4(wb);
    const cuda::DeviceLinear* d[2] = {&da, &db};
    check_pair(
        ctx, wa, wb, seed,
        [&](const uint16_t* x, int64_t M, void* ya, void* yb, cuda::OutType ot) {
          return cuda::linear_nvfp4_pair(ctx, da, db, x, M, c.K, ya, c.Na, yb, c.Nb, ot);
        },
        [&](int k, const uint16_t* x, int64_t M, void* y, cuda::OutType ot) {
          cuda::linear_nvfp4(ctx, *d[k], x, M, c.K, y, d[k]->N, ot);
        });
  }
}

TEST(GpuLinearPair, DeclinesWhatItCannotPair) {
  CM_SKIP_WITHOUT_GPU();
  cuda::Context ctx;
  const cuda::DeviceFp8Linear a = cuda::upload_fp8(random_fp8(256, 512, 1, Fp8Scales::E8M0));
  const cuda::DeviceFp8Linear b = cuda::upload_fp8(random_fp8(128, 512, 2, Fp8Scales::E8M0));
  const cuda::DeviceFp8Linear k = cuda::upload_fp8(random_fp8(128, 256, 3, Fp8Scales::E8M0));
  const cuda::DeviceFp8Linear g = cuda::upload_fp8(random_fp8(256, 512, 4, Fp8Scales::E8M0), 2);  // same K, grouped
  cuda::DeviceBuffer x(64 * 512 * 2);
  Guarded<float> ya(64 * 256), yb(64 * 256);
  const uint16_t* xp = x.as<const uint16_t>();
  EXPECT_FALSE(cuda::linear_fp8_pair(ctx, a, b, xp, 33, 512, ya.ptr(), 256, yb.ptr(), 128, cuda::OutType::F32));
  EXPECT_FALSE(cuda::linear_fp8_pair(ctx, a, k, xp, 1, 512, ya.ptr(), 256, yb.ptr(), 128, cuda::OutType::F32));
  EXPECT_FALSE(cuda::linear_fp8_pair(ctx, g, b, xp, 1, 512, ya.ptr(), 256, yb.ptr(), 128, cuda::OutType::F32));
  ctx.sync();
  // Nothing was written (the outputs still hold their NaN fill).
  for (float v : ya.get()) ASSERT_TRUE(std::isnan(v));
  for (float v : yb.get()) ASSERT_TRUE(std::isnan(v));
}

// The step lets wo_a and the experts' SwiGLU write bf16 for an FP8/NVFP4 consumer instead of f32 that
// run_linear then casts: the same bits, on every path run_linear takes (decode below 128 rows, the
// prefill kernels from there) and in SwiGLU.
TEST(GpuLinearPair, Bf16OutputIsTheCastOfTheF32Output) {
  CM_SKIP_WITHOUT_GPU();
  cuda::Context ctx;
  const int64_t N = 520, K = 1024;  // N: row blocks past one 128-row tile, not a multiple of 16·8
  const cuda::DeviceFp8Linear f8 = cuda::upload_fp8(random_fp8(N, K, 7, Fp8Scales::F32_ANY));
  const cuda::DeviceLinear f4 = cuda::upload_nvfp4(gputest::random_nvfp4(N, K, 8));
  for (int64_t M : {1, 17, 40, 127, 128, 200}) {
    std::vector<uint16_t> xb;
    std::vector<float> xf;
    gputest::random_bf16(size_t(M * K), 50 + uint64_t(M), 2.0f, xb, xf);
    cuda::DeviceBuffer dx(xb.size() * 2);
    dx.upload(xb.data(), xb.size() * 2);
    const uint16_t* x = dx.as<const uint16_t>();
    for (int fmt = 0; fmt < 2; ++fmt) {
      SCOPED_TRACE(testing::Message() << (fmt ? "nvfp4" : "fp8") << " M=" << M);
      Guarded<float> yf(size_t(M * N));
      Guarded<uint16_t> yb(size_t(M * N));
      cuda::DeviceBuffer cast(size_t(M * N) * 2);
      for (int bf = 0; bf < 2; ++bf) {  // run_linear's calls
        void* y = bf ? static_cast<void*>(yb.ptr()) : static_cast<void*>(yf.ptr());
        const cuda::OutType ot = bf ? cuda::OutType::BF16 : cuda::OutType::F32;
        if (fmt)
          cuda::linear_nvfp4(ctx, f4, x, M, K, y, N, ot, cuda::kNvfp4TilesMinRows - 1, cuda::PrefillKernel::MmaTiles);
        else
          cuda::linear_fp8(ctx, f8, x, M, K, y, N, ot, cuda::kFp8PrefillMinM - 1, cuda::Fp8Prefill::Exact);
      }
      cuda::cast_f32_bf16(ctx, yf.ptr(), N, M, N, cast.as<uint16_t>(), N);
      ctx.sync();
      const std::vector<uint16_t> got = yb.get(), want = gputest::from_device<uint16_t>(cast, size_t(M * N));
      (void)yf.get();  // canaries
      EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * 2), 0);
    }
  }
  // SwiGLU (the shared expert's, 2048 wide in V4-Flash), with the clamp.
  Rng r(9);
  const int64_t rows = 5, I = 2048;
  const std::vector<float> g = gputest::rand_f32(size_t(rows * I), r, 12.0f), u = gputest::rand_f32(size_t(rows * I), r, 12.0f);
  cuda::DeviceBuffer dg = gputest::to_device(g), du = gputest::to_device(u), cast(size_t(rows * I) * 2);
  Guarded<float> hf(size_t(rows * I));
  Guarded<uint16_t> hb(size_t(rows * I));
  swiglu_cuda(ctx, dg.as<float>(), du.as<float>(), I, rows, I, 10.0f, nullptr, hf.ptr(), false);
  swiglu_cuda(ctx, dg.as<float>(), du.as<float>(), I, rows, I, 10.0f, nullptr, hb.ptr(), true);
  cuda::cast_f32_bf16(ctx, hf.ptr(), I, rows, I, cast.as<uint16_t>(), I);
  ctx.sync();
  const std::vector<uint16_t> got = hb.get(), want = gputest::from_device<uint16_t>(cast, size_t(rows * I));
  (void)hf.get();
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * 2), 0) << "swiglu";
}

}  // namespace
}  // namespace cm
