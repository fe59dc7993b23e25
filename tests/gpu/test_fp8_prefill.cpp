// FP8 prefill kernel (sm90_fp8_prefill.cu) and batch invariance of the FP8
// linear: the engine needs a row's result not to depend on how many rows
// share the call or how the prompt was chunked, bit for bit. On random
// weights (tests/release_weights.h, E8M0 and arbitrary F32 scales) and
// activations, for V4-Flash's FP8 shapes (grouped wo_a, wo_b, wq_b, q_a,
// shared-expert w1/w3) and odd ones (N not a multiple of 16 or 128, K an odd
// multiple of 128 or not a multiple of 64, grouped), at M = 65 .. 2048:
//  - the prefill kernel's output equals the decode kernel's over 32-token
//    slices (memcmp, F32 and BF16 outputs), and the decode kernel on single
//    rows for a sample of rows (which also checks the decode kernel itself is
//    invariant across its MT variants: its slices use MT = 4, 2 or 1);
//  - the prefill path matches the CPU reference (linear_check.h bounds) and
//    writes nothing outside its output (canaries before, after and between
//    rows, also checked on every bit-comparison run);
//  - the engine's entry (run_linear) gives a prompt in chunks the bits of the
//    whole, across kFp8PrefillMinM; the shapes cover split and unsplit K.
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <memory>

#include "../release_weights.h"
#include "backend/cuda/linear/linear.h"
#include "backend/cuda/device_model.h"
#include "gpu_test_util.h"
#include "linear_check.h"

namespace cm {
namespace {

using gputest::random_bf16;
using testw::Fp8Scales;
using testw::random_fp8;

constexpr int64_t kDecodeOnly = std::numeric_limits<int64_t>::max();

// Runs run(y, ldy, ot) into a buffer with canaries around and between the
// rows (8 extra columns) and returns the M x N output bytes (row-major, packed).
template <typename Run>
std::vector<uint8_t> run_guarded(int64_t M, int64_t N, cuda::OutType ot, Run&& run) {
  const size_t es = ot == cuda::OutType::F32 ? 4 : 2;
  const int64_t ldy = N + 8;
  const size_t pad = 4096, body = size_t(M * ldy) * es;
  cuda::DeviceBuffer dy(pad + body + pad);
  CM_CUDA(cudaMemset(dy.get(), 0xA5, dy.size()));
  run(dy.as<char>() + pad, ldy);
  CM_CUDA(cudaDeviceSynchronize());
  std::vector<uint8_t> raw(dy.size()), out(size_t(M * N) * es);
  dy.download(raw.data(), raw.size());
  for (size_t i = 0; i < pad; ++i) {
    EXPECT_EQ(raw[i], 0xA5) << "canary before the output overwritten at " << i;
    EXPECT_EQ(raw[pad + body + i], 0xA5) << "canary after the output overwritten at " << i;
    if (raw[i] != 0xA5 || raw[pad + body + i] != 0xA5) break;
  }
  for (int64_t m = 0; m < M; ++m) {
    const uint8_t* row = raw.data() + pad + size_t(m * ldy) * es;
    std::memcpy(out.data() + size_t(m * N) * es, row, size_t(N) * es);
    for (size_t i = size_t(N) * es; i < size_t(ldy) * es; ++i)
      if (row[i] != 0xA5) {
        ADD_FAILURE() << "canary column overwritten in row " << m;
        break;
      }
  }
  return out;
}

// First differing output of two [M, N] results, as "row m col n" ("" if equal).
std::string first_diff(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b, int64_t N, size_t es) {
  if (a.size() != b.size()) return "size";
  for (size_t i = 0; i < a.size(); i += es)
    if (std::memcmp(&a[i], &b[i], es) != 0) {
      const int64_t e = int64_t(i / es);
      return "row " + std::to_string(e / N) + " col " + std::to_string(e % N);
    }
  return "";
}

// Random activations [M, KX] (values in xf) on the device.
cuda::DeviceBuffer random_x(int64_t M, int64_t KX, uint64_t seed, std::vector<float>& xf) {
  std::vector<uint16_t> xb;
  random_bf16(size_t(M * KX), seed, 2.0f, xb, xf);
  cuda::DeviceBuffer dx(xb.size() * 2);
  dx.upload(xb.data(), xb.size() * 2);
  return dx;
}

struct Case {
  int64_t N, K;
  int groups;
  std::vector<int64_t> ms;
};

// Prefill vs decode slices (all rows) vs decode on single rows (a sample),
// bit for bit, both output types.
void check_bits(cuda::Context& ctx, const cuda::DeviceFp8Linear& dw, int64_t M, uint64_t seed) {
  const int64_t N = dw.N, KX = dw.K * dw.groups;
  std::vector<float> xf;
  const cuda::DeviceBuffer dx = random_x(M, KX, seed, xf);
  const uint16_t* x = dx.as<const uint16_t>();
  std::vector<int64_t> rows = {0, 1, 7, 8, 31, 32, 63, M - 1};
  if (M > 64) rows.insert(rows.end(), {64, 65, M / 2, M - 2});
  for (cuda::OutType ot : {cuda::OutType::F32, cuda::OutType::BF16}) {
    SCOPED_TRACE(ot == cuda::OutType::F32 ? "f32 output" : "bf16 output");
    const size_t es = ot == cuda::OutType::F32 ? 4 : 2;
    const char* path = nullptr;
    const std::vector<uint8_t> pre = run_guarded(M, N, ot, [&](void* y, int64_t ldy) {
      path = cuda::linear_fp8(ctx, dw, x, M, KX, y, ldy, ot, 0, cuda::Fp8Prefill::Exact);
    });
    EXPECT_STREQ(path, cuda::kFp8PathPrefill);
    const std::vector<uint8_t> dec = run_guarded(
        M, N, ot, [&](void* y, int64_t ldy) { path = cuda::linear_fp8(ctx, dw, x, M, KX, y, ldy, ot, kDecodeOnly); });
    EXPECT_STREQ(path, cuda::kFp8PathDecode);
    EXPECT_EQ(first_diff(pre, dec, N, es), "") << "prefill vs decode slices";
    for (int64_t m : rows) {
      if (m < 0 || m >= M) continue;
      const std::vector<uint8_t> one = run_guarded(
          1, N, ot, [&](void* y, int64_t ldy) { cuda::linear_fp8(ctx, dw, x + m * KX, 1, KX, y, ldy, ot, kDecodeOnly); });
      EXPECT_EQ(std::memcmp(one.data(), pre.data() + size_t(m * N) * es, size_t(N) * es), 0)
          << "row " << m << " alone (decode, one token) differs from the prefill kernel's row";
    }
  }
}

// Bits (check_bits) at every M of the case, and the CPU reference at the M up to max_ref_m.
void run_case(cuda::Context& ctx, const Case& c, Fp8Scales scales, uint64_t seed, int64_t max_ref_m) {
  LinearWeight w = random_fp8(c.N, c.K, seed, scales);
  cuda::DeviceFp8Linear dw = cuda::upload_fp8(w, c.groups);
  const int64_t KX = c.K * c.groups;
  for (int64_t M : c.ms) {
    SCOPED_TRACE(testing::Message() << "N=" << c.N << " K=" << c.K << " groups=" << c.groups << " M=" << M
                                    << " scales=" << int(scales) << " chunks/split=" << cuda::fp8_chunks_per_split(ctx, dw)
                                    << " of " << dw.chunks);
    check_bits(ctx, dw, M, seed * 31 + uint64_t(M));
    if (M > max_ref_m) continue;
    std::vector<float> xf;
    const cuda::DeviceBuffer dx = random_x(M, KX, seed * 17 + uint64_t(M), xf);
    gputest::check_linear_outputs(M, c.N, gputest::reference_linear(w, c.groups, xf, M),
                                  [&](void* y, int64_t ldy, cuda::OutType ot) {
                                    cuda::linear_fp8_prefill(ctx, dw, dx.as<const uint16_t>(), M, KX, y, ldy, ot);
                                  });
  }
}

TEST(GpuFp8Prefill, OddShapesMatchDecodeBitsAndCpu) {
  CM_SKIP_WITHOUT_GPU();
  cuda::Context ctx;
  const std::vector<int64_t> ms = {65, 129, 1000, 2048};
  for (Fp8Scales s : {Fp8Scales::E8M0, Fp8Scales::F32_ANY})
    for (const Case& c : {Case{200, 384, 1, ms}, Case{130, 640, 1, ms}, Case{300, 1152, 1, ms}, Case{16, 336, 1, ms},
                          Case{1000, 208, 1, {65, 1000}}, Case{160, 1152, 2, ms}, Case{480, 384, 3, {129, 1000}},
                          // >= 8 row blocks per SM: the decode kernel's unsplit variant, ragged N
                          Case{16900, 384, 1, {129, 300}}})
      run_case(ctx, c, s, uint64_t(c.N * 131 + c.K + int(s)), 1000);
}

TEST(GpuFp8Prefill, FlashShapesMatchDecodeBits) {
  CM_SKIP_WITHOUT_GPU();
  cuda::Context ctx;
  // wo_a (grouped), wo_b, wq_b, shared-expert w1/w3, q_a; CPU reference at M = 129.
  for (const Case& c : {Case{8192, 4096, 8, {129, 2048}}, Case{4096, 8192, 1, {129, 2048}},
                        Case{32768, 1024, 1, {129, 2048}}, Case{2048, 4096, 1, {129, 2048}},
                        Case{1024, 4096, 1, {129, 2048}}})
    run_case(ctx, c, Fp8Scales::E8M0, uint64_t(c.N + 3 * c.K), 129);
  // F32 (non power of two) scales on the split and unsplit shapes
  for (const Case& c : {Case{2048, 4096, 1, {1000}}, Case{8192, 4096, 8, {1000}}})
    run_case(ctx, c, Fp8Scales::F32_ANY, uint64_t(c.N + 5 * c.K), 0);
}

// The shapes above cover both K layouts: split K (decode's last-arriver
// reduction, the prefill kernel's running sum) and unsplit.
TEST(GpuFp8Prefill, ShapesCoverSplitAndUnsplitK) {
  CM_SKIP_WITHOUT_GPU();
  cuda::Context ctx;
  auto splits = [&](int64_t N, int64_t K, int groups) {
    cuda::DeviceFp8Linear dw = cuda::upload_fp8(random_fp8(N, K, 1, Fp8Scales::E8M0), groups);
    const int64_t per = cuda::fp8_chunks_per_split(ctx, dw);
    return (dw.chunks + per - 1) / per;
  };
  EXPECT_GT(splits(2048, 4096, 1), 1);   // shared-expert w1/w3
  EXPECT_GT(splits(300, 1152, 1), 1);    // 18 chunks: 2 splits of 9
  EXPECT_GT(splits(160, 1152, 2), 1);
  EXPECT_EQ(splits(32768, 1024, 1), 1);  // wq_b: many row blocks
  EXPECT_EQ(splits(16900, 384, 1), 1);
}

// The engine's entry (run_linear, which runs the prefill kernel from
// kFp8PrefillMinM rows): a prompt in chunks on either side of that threshold
// gives the same bits as the whole, as the decode kernel and as the prefill kernel.
TEST(GpuFp8Prefill, RunLinearIsChunkingInvariant) {
  CM_SKIP_WITHOUT_GPU();
  cuda::Context ctx;
  const int64_t N = 1024, K = 4096, M = 4 * cuda::kFp8PrefillMinM + 5;
  cuda::DevLinear dl;
  dl.name = "test.fp8";
  dl.format = WeightFormat::FP8_BLOCK;
  dl.N = N;
  dl.K = K;
  dl.fp8 = std::make_unique<cuda::DeviceFp8Linear>(cuda::upload_fp8(random_fp8(N, K, 77, Fp8Scales::E8M0)));
  std::vector<float> xf;
  const cuda::DeviceBuffer dx = random_x(M, K, 78, xf);
  const uint16_t* x = dx.as<const uint16_t>();
  auto rows = [&](int64_t m0, int64_t count, void* y, int64_t ldy) {
    cuda::run_linear(ctx, dl, x + m0 * K, true, count, K, static_cast<uint16_t*>(y) + m0 * ldy, true, ldy, nullptr);
  };
  const std::vector<uint8_t> whole =
      run_guarded(M, N, cuda::OutType::BF16, [&](void* y, int64_t ldy) { rows(0, M, y, ldy); });
  // chunks of 200 (prefill kernel), 127 (decode), 189 (prefill) and 1 (decode)
  const std::vector<uint8_t> chunked = run_guarded(M, N, cuda::OutType::BF16, [&](void* y, int64_t ldy) {
    rows(0, 200, y, ldy);
    rows(200, 127, y, ldy);
    rows(327, M - 328, y, ldy);
    rows(M - 1, 1, y, ldy);
  });
  EXPECT_EQ(first_diff(whole, chunked, N, 2), "");
  const std::vector<uint8_t> dec = run_guarded(M, N, cuda::OutType::BF16, [&](void* y, int64_t ldy) {
    EXPECT_STREQ(cuda::linear_fp8(ctx, *dl.fp8, x, M, K, y, ldy, cuda::OutType::BF16, kDecodeOnly),
                 cuda::kFp8PathDecode);
  });
  EXPECT_EQ(first_diff(whole, dec, N, 2), "");
  const std::vector<uint8_t> pre = run_guarded(M, N, cuda::OutType::BF16, [&](void* y, int64_t ldy) {
    EXPECT_STREQ(cuda::linear_fp8(ctx, *dl.fp8, x, M, K, y, ldy, cuda::OutType::BF16, cuda::kFp8PrefillMinM - 1,
                                  cuda::Fp8Prefill::Exact),
                 cuda::kFp8PathPrefill);
  });
  EXPECT_EQ(first_diff(whole, pre, N, 2), "");
}

}  // namespace
}  // namespace cm
