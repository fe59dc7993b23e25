// Batch invariance of the NVFP4 linear on the GPU: the mma.sync prefill
// kernel (linear_nvfp4_tiles) must give, bit for bit, what the decode kernel
// gives for the same row, whether the decode kernel ran the rows in 32-row
// slices or one at a time; and the decode kernel itself must give a row the
// same bits in a launch of 1, 9..16 or 17..32 rows (its MT variants share one
// K split). On V4-Flash's shapes (wq_a, wq_b, grouped wo_a, wo_b, shared
// expert w1/w3 and w2, kv) and odd ones (N not a multiple of 16 or 64, K = 64
// times an odd number or not a multiple of 64, groups of 2 row blocks, many
// row blocks: the unsplit decode variant), M = 65, 129, 1000, 2048, F32 and
// BF16 outputs, canaries around and between the output rows. Sampled rows
// also against the CPU reference (linear_check.h's bounds).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <limits>

#include "backend/cuda/linear/linear.h"
#include "gpu_test_util.h"
#include "linear_check.h"

namespace cm {
namespace {

using gputest::random_bf16;

constexpr int64_t kSlices = std::numeric_limits<int64_t>::max();  // decode_max_m: the decode kernel at any M
constexpr size_t kPad = 4096;                                      // canary bytes before and after the output
constexpr int64_t kCanaryCols = 8;                                 // canary columns after each row

// Raw output rows [M, N] of run(y, ldy) into a canaried buffer; fails the
// test if a canary byte changed.
template <typename Run>
std::vector<uint8_t> run_guarded(int64_t M, int64_t N, cuda::OutType ot, Run&& run) {
  const size_t es = ot == cuda::OutType::F32 ? 4 : 2;
  const int64_t ldy = N + kCanaryCols;
  const size_t body = size_t(M * ldy) * es;
  cuda::DeviceBuffer dy(kPad + body + kPad);
  CM_CUDA(cudaMemset(dy.get(), 0xA5, dy.size()));
  run(dy.as<char>() + kPad, ldy);
  CM_CUDA(cudaDeviceSynchronize());
  std::vector<uint8_t> raw(dy.size());
  dy.download(raw.data(), raw.size());
  std::vector<uint8_t> rows(size_t(M * N) * es);
  for (size_t i = 0; i < kPad; ++i) {
    EXPECT_EQ(raw[i], 0xA5) << "canary before the output overwritten at " << i;
    EXPECT_EQ(raw[kPad + body + i], 0xA5) << "canary after the output overwritten at " << i;
    if (raw[i] != 0xA5 || raw[kPad + body + i] != 0xA5) break;
  }
  for (int64_t m = 0; m < M; ++m) {
    const uint8_t* row = raw.data() + kPad + size_t(m * ldy) * es;
    std::memcpy(&rows[size_t(m * N) * es], row, size_t(N) * es);
    for (size_t i = size_t(N) * es; i < size_t(ldy) * es; ++i)
      if (row[i] != 0xA5) {
        ADD_FAILURE() << "canary column overwritten in row " << m;
        break;
      }
  }
  return rows;
}

float out_value(const std::vector<uint8_t>& rows, size_t i, cuda::OutType ot) {
  if (ot == cuda::OutType::F32) {
    float v;
    std::memcpy(&v, &rows[i * 4], 4);
    return v;
  }
  uint16_t b;
  std::memcpy(&b, &rows[i * 2], 2);
  return bf16_to_f32(b);
}

struct Case {
  int64_t N, K;
  int groups;
  std::vector<int64_t> ms;
};

// For each M: prefill kernel vs decode slices (every row, memcmp), vs the
// decode kernel on single rows (a sample), and the sampled rows vs the CPU.
void check_case(cuda::Context& ctx, const Case& c, uint64_t seed) {
  const int64_t KX = c.K * c.groups;
  LinearWeight w = gputest::random_nvfp4(c.N, c.K, seed);
  cuda::DeviceLinear dw = cuda::upload_nvfp4(w, c.groups);
  for (int64_t M : c.ms) {
    SCOPED_TRACE(testing::Message() << "N=" << c.N << " K=" << c.K << " groups=" << c.groups << " M=" << M);
    std::vector<uint16_t> xb;
    std::vector<float> xf;
    random_bf16(size_t(M * KX), seed * 31 + uint64_t(M), 2.0f, xb, xf);
    cuda::DeviceBuffer dx(xb.size() * 2);
    dx.upload(xb.data(), xb.size() * 2);
    const uint16_t* x = dx.as<const uint16_t>();
    // Sampled rows: first, last, the tile edges around 64 and a few spread out.
    std::vector<int64_t> sample = {0, M - 1, std::min<int64_t>(63, M - 1), std::min<int64_t>(64, M - 1), M / 2,
                                   M / 3 + 1};
    std::sort(sample.begin(), sample.end());
    sample.erase(std::unique(sample.begin(), sample.end()), sample.end());
    std::vector<float> xs(sample.size() * size_t(KX));
    for (size_t i = 0; i < sample.size(); ++i)
      std::memcpy(&xs[i * size_t(KX)], &xf[size_t(sample[i] * KX)], size_t(KX) * 4);
    const std::vector<float> ref = gputest::reference_linear(w, c.groups, xs, int64_t(sample.size()));
    for (cuda::OutType ot : {cuda::OutType::F32, cuda::OutType::BF16}) {
      SCOPED_TRACE(ot == cuda::OutType::F32 ? "f32 output" : "bf16 output");
      const size_t es = ot == cuda::OutType::F32 ? 4 : 2;
      const std::vector<uint8_t> tiles = run_guarded(M, c.N, ot, [&](void* y, int64_t ldy) {
        cuda::linear_nvfp4_tiles(ctx, dw, x, M, KX, y, ldy, ot);
      });
      const std::vector<uint8_t> slices = run_guarded(M, c.N, ot, [&](void* y, int64_t ldy) {
        cuda::linear_nvfp4(ctx, dw, x, M, KX, y, ldy, ot, kSlices);
      });
      ASSERT_EQ(tiles.size(), slices.size());
      if (std::memcmp(tiles.data(), slices.data(), tiles.size()) != 0) {
        size_t i = 0;
        while (std::memcmp(&tiles[i * es], &slices[i * es], es) == 0) ++i;
        FAIL() << "prefill kernel differs from the decode slices first at row " << int64_t(i) / c.N << " column "
               << int64_t(i) % c.N << ": " << out_value(tiles, i, ot) << " vs " << out_value(slices, i, ot);
      }
      std::vector<float> got(sample.size() * size_t(c.N));
      for (size_t i = 0; i < sample.size(); ++i) {
        const int64_t m = sample[i];
        const std::vector<uint8_t> one = run_guarded(1, c.N, ot, [&](void* y, int64_t ldy) {
          cuda::linear_nvfp4(ctx, dw, x + m * KX, 1, KX, y, ldy, ot, kSlices);
        });
        EXPECT_EQ(std::memcmp(one.data(), &tiles[size_t(m * c.N) * es], one.size()), 0)
            << "row " << m << ": the decode kernel on the row alone differs from the prefill kernel";
        for (int64_t n = 0; n < c.N; ++n) got[i * size_t(c.N) + size_t(n)] = out_value(tiles, size_t(m * c.N + n), ot);
      }
      int64_t nonfinite = 0;
      EXPECT_LE(gputest::rel_error(got, ref, &nonfinite), ot == cuda::OutType::F32 ? 1e-5 : 1e-2);
      EXPECT_EQ(nonfinite, 0);
    }
  }
}

TEST(GpuNvfp4Prefill, FlashShapesMatchDecodeBits) {
  CM_SKIP_WITHOUT_GPU();
  cuda::Context ctx;
  const std::vector<int64_t> ms = {129, 2048};
  for (const Case& c : {Case{1024, 4096, 1, ms},  // wq_a
                        Case{32768, 1024, 1, ms},  // wq_b
                        Case{8192, 4096, 8, ms},   // wo_a: 8 groups of 1024 rows, each its own 4096 columns of x
                        Case{4096, 8192, 1, ms},   // wo_b
                        Case{2048, 4096, 1, ms},   // shared expert w1 / w3
                        Case{4096, 2048, 1, ms},   // shared expert w2
                        Case{512, 4096, 1, ms}})   // kv
    check_case(ctx, c, uint64_t(c.N * 3 + c.K + c.groups));
}

TEST(GpuNvfp4Prefill, OddShapesMatchDecodeBits) {
  CM_SKIP_WITHOUT_GPU();
  cuda::Context ctx;
  const std::vector<int64_t> ms = {65, 129, 1000, 2048};
  for (const Case& c : {Case{1000, 64 * 23, 1, ms},  // N not a multiple of 64, K = 64 * odd
                        Case{100, 1008, 1, ms},       // K % 64 = 48: a ragged last chunk
                        Case{3, 64, 1, ms},           // one partial row block
                        Case{130, 80, 1, ms},
                        Case{64, 4096, 2, ms},         // groups of 2 row blocks (each CTA stays in its group)
                        Case{96, 64 * 7, 3, {65, 1000}},  // groups of 2 row blocks, 3 groups, K = 64 * 7
                        Case{16900, 80, 1, {65, 1000}},   // >= 8 row blocks per SM: the unsplit decode variant
                        Case{10000, 192, 1, {129}}})
    check_case(ctx, c, uint64_t(c.N * 7 + c.K));
}

// The decode kernel alone: a row gets the same bits in launches of 1 (MT = 1),
// 9..16 (MT = 2) and 17..32 rows (MT = 4) and as the last row of a 33-row call
// (a second slice of one row). Its MT variants have different occupancies;
// they must still split K the same way (decode_split in linear_host.cuh).
TEST(GpuNvfp4Prefill, DecodeKernelIsBatchInvariant) {
  CM_SKIP_WITHOUT_GPU();
  cuda::Context ctx;
  for (const Case& c : {Case{2048, 4096, 1, {}}, Case{4096, 2048, 1, {}}, Case{1024, 4096, 1, {}},
                        Case{4096, 8192, 1, {}}, Case{8192, 4096, 8, {}}, Case{100, 1008, 1, {}}}) {
    SCOPED_TRACE(testing::Message() << "N=" << c.N << " K=" << c.K << " groups=" << c.groups);
    const int64_t KX = c.K * c.groups, M = 33;
    LinearWeight w = gputest::random_nvfp4(c.N, c.K, uint64_t(c.N + c.K));
    cuda::DeviceLinear dw = cuda::upload_nvfp4(w, c.groups);
    std::vector<uint16_t> xb;
    std::vector<float> xf;
    random_bf16(size_t(M * KX), 5, 2.0f, xb, xf);
    cuda::DeviceBuffer dx(xb.size() * 2);
    dx.upload(xb.data(), xb.size() * 2);
    const uint16_t* x = dx.as<const uint16_t>();
    for (cuda::OutType ot : {cuda::OutType::F32, cuda::OutType::BF16}) {
      const size_t row = size_t(c.N) * (ot == cuda::OutType::F32 ? 4 : 2);
      auto call = [&](int64_t m0, int64_t rows) {
        return run_guarded(rows, c.N, ot, [&](void* y, int64_t ldy) {
          cuda::linear_nvfp4(ctx, dw, x + m0 * KX, rows, KX, y, ldy, ot, kSlices);
        });
      };
      const std::vector<uint8_t> all = call(0, M), mt2 = call(0, 12), mt4 = call(0, 20), last = call(M - 1, 1);
      for (int64_t m : {int64_t(0), int64_t(11)}) {
        const std::vector<uint8_t> one = call(m, 1);
        EXPECT_EQ(std::memcmp(one.data(), &all[m * row], row), 0) << "row " << m << " alone vs in 33 rows";
        EXPECT_EQ(std::memcmp(one.data(), &mt2[m * row], row), 0) << "row " << m << " alone vs in 12 rows";
        EXPECT_EQ(std::memcmp(one.data(), &mt4[m * row], row), 0) << "row " << m << " alone vs in 20 rows";
      }
      EXPECT_EQ(std::memcmp(last.data(), &all[(M - 1) * row], row), 0) << "row 32 alone vs in 33 rows";
    }
  }
}

// The model's dispatch: decode slices below kNvfp4TilesMinRows, the prefill kernel from there.
TEST(GpuNvfp4Prefill, Dispatch) {
  CM_SKIP_WITHOUT_GPU();
  cuda::DeviceLinear w = cuda::random_nvfp4(256, 512, 3);
  const int64_t dmax = cuda::kNvfp4TilesMinRows - 1;
  EXPECT_STREQ(cuda::linear_nvfp4_path(w, dmax, dmax, cuda::PrefillKernel::MmaTiles), "mma.sync decode");
  EXPECT_STREQ(cuda::linear_nvfp4_path(w, dmax + 1, dmax, cuda::PrefillKernel::MmaTiles), "mma.sync prefill");
}

// A prefill linear reading the previous prefill linear's output: with
// programmatic dependent launch the second kernel may start early, so its
// reads of x must wait (griddepcontrol.wait). The intermediate starts as NaN
// each round; the result must be the decode chain's bits.
TEST(GpuNvfp4Prefill, ChainedLaunchesSeeEarlierOutputs) {
  CM_SKIP_WITHOUT_GPU();
  const int64_t M = 300, K1 = 4096, N1 = 2048, N2 = 4096;
  LinearWeight w1 = gputest::random_nvfp4(N1, K1, 81), w2 = gputest::random_nvfp4(N2, N1, 82);
  std::vector<uint16_t> xb;
  std::vector<float> xf;
  random_bf16(size_t(M * K1), 83, 2.0f, xb, xf);
  for (bool pdl : {true, false}) {
    cuda::Context ctx(0, pdl);
    cuda::DeviceLinear d1 = cuda::upload_nvfp4(w1), d2 = cuda::upload_nvfp4(w2);
    cuda::DeviceBuffer dx(xb.size() * 2), dh(size_t(M * N1) * 2), dy(size_t(M * N2) * 4);
    dx.upload(xb.data(), xb.size() * 2);
    std::vector<float> want(size_t(M * N2)), got(want.size());
    cuda::linear_nvfp4(ctx, d1, dx.as<const uint16_t>(), M, K1, dh.get(), N1, cuda::OutType::BF16, kSlices);
    cuda::linear_nvfp4(ctx, d2, dh.as<const uint16_t>(), M, N1, dy.get(), N2, cuda::OutType::F32, kSlices);
    ctx.sync();
    dy.download(want.data(), want.size() * 4);
    for (int round = 0; round < 10; ++round) {
      CM_CUDA(cudaMemsetAsync(dh.get(), 0xFF, dh.size(), ctx.stream()));  // bf16 NaN
      cuda::linear_nvfp4_tiles(ctx, d1, dx.as<const uint16_t>(), M, K1, dh.get(), N1, cuda::OutType::BF16);
      cuda::linear_nvfp4_tiles(ctx, d2, dh.as<const uint16_t>(), M, N1, dy.get(), N2, cuda::OutType::F32);
      ctx.sync();
      dy.download(got.data(), got.size() * 4);
      ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0) << "pdl=" << pdl << " round " << round;
    }
  }
}

}  // namespace
}  // namespace cm
