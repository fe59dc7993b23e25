// Host-side packers of the GPU release formats (no GPU needed, runs in CI):
//  - the E4M3 -> BF16 bit trick of the FP8 kernels over all 256 x 256 code
//    pairs against a decoder written from the bit fields (quant_test_util.h);
//  - FP8 128x128-block packing: every packed value reads back as the CPU
//    expansion (linear_expand_row), ragged N and K included, padding zero,
//    the power-of-two detection that gates the bf16 prefill, and the errors;
//  - MXFP4 repacking into the NVFP4 layout: exact readback over the widest
//    exponent span the scale byte holds and at the E8M0 extremes, and the
//    refusals (span too wide, NaN code 0xFF, bad K, bad scale dtype).
#include <gtest/gtest.h>

#include <cmath>

#include "backend/cuda/linear/fp8_pack.h"
#include "backend/cuda/linear/nvfp4_pack.h"
#include "quant_test_util.h"
#include "release_weights.h"

using namespace cm;

namespace {

using cuda::Fp8Packed;
using testw::Fp8Scales;
using testw::random_fp8;
using testw::random_mxfp4;

double bf16_value(uint16_t h) {
  int s = h >> 15, e = (h >> 7) & 0xff, m = h & 0x7f;
  double v = e == 0 ? std::ldexp(m / 128.0, -126) : std::ldexp(1.0 + m / 128.0, e - 127);
  return s ? -v : v;
}

TEST(ReleasePack, Fp8ToBf16BitTrickAllCodes) {
  for (int b0 = 0; b0 < 256; ++b0)
    for (int b1 = 0; b1 < 256; ++b1) {
      const uint32_t v = cuda::fp8x2_to_bf16x2_raw(cuda::fp8x2_spread(uint8_t(b0), uint8_t(b1)));
      const int codes[2] = {b0, b1};
      const uint16_t halves[2] = {uint16_t(v & 0xffff), uint16_t(v >> 16)};
      for (int i = 0; i < 2; ++i) {
        const double ref = qt::ref_e4m3(codes[i]);
        if (std::isnan(ref)) continue;  // NaN codes are refused by pack_fp8
        ASSERT_EQ(std::ldexp(bf16_value(halves[i]), 120), ref) << "codes " << b0 << ", " << b1 << " half " << i;
        ASSERT_EQ(halves[i] >> 15, codes[i] >> 7) << "sign of code " << codes[i];  // -0 keeps its sign
      }
    }
  // The constant the kernels multiply by is bf16 2^120 in both halves.
  EXPECT_EQ(bf16_value(uint16_t(cuda::kBf16x2Pow120 & 0xffff)), std::ldexp(1.0, 120));
  EXPECT_EQ(bf16_value(uint16_t(cuda::kBf16x2Pow120 >> 16)), std::ldexp(1.0, 120));
}

// Every packed value equals the CPU expansion; bytes outside [N, K] are zero.
void expect_fp8_readback(const LinearWeight& w, const Fp8Packed& p) {
  const int64_t N = w.out_features, K = w.in_features;
  std::vector<float> row(static_cast<size_t>(K));
  for (int64_t n = 0; n < N; ++n) {
    linear_expand_row(w, n, row.data());
    for (int64_t k = 0; k < K; ++k)
      ASSERT_EQ(cuda::packed_fp8_value(p, n, k), row[size_t(k)]) << w.name << " n=" << n << " k=" << k;
  }
  for (int64_t rb = 0; rb < p.row_blocks; ++rb)
    for (int64_t c = 0; c < p.chunks; ++c)
      for (int h = 0; h < 2; ++h)
        for (int lane = 0; lane < 32; ++lane) {
          const int64_t n = rb * 16 + lane / 4 + 8 * h, k0 = c * 64 + 16 * (lane % 4);
          if (n < N && k0 < K) continue;
          for (int i = 0; i < 16; ++i)
            ASSERT_EQ(p.data[size_t((rb * p.chunks + c) * 1024 + h * 512 + lane * 16 + i)], 0) << "padding byte";
        }
}

TEST(ReleasePack, Fp8PackedValuesMatchCpuExpansion) {
  struct S {
    int64_t N, K;
  };
  for (S s : {S{16, 16}, S{200, 336}, S{130, 272}, S{300, 1040}, S{256, 128}}) {
    for (Fp8Scales kind : {Fp8Scales::E8M0, Fp8Scales::F32_POW2, Fp8Scales::F32_ANY}) {
      SCOPED_TRACE(testing::Message() << s.N << "x" << s.K << " scales " << int(kind));
      LinearWeight w = random_fp8(s.N, s.K, uint64_t(s.N * 1000 + s.K + int(kind)), kind);
      Fp8Packed p = cuda::pack_fp8(w);
      EXPECT_EQ(p.row_blocks, (s.N + 15) / 16);
      EXPECT_EQ(p.chunks, (s.K + 63) / 64);
      EXPECT_EQ(p.pow2_scales, kind != Fp8Scales::F32_ANY);
      expect_fp8_readback(w, p);
    }
  }
}

TEST(ReleasePack, Fp8Pow2GateCoversOnlyExactBf16Range) {
  LinearWeight w = random_fp8(128, 128, 7, Fp8Scales::E8M0);
  w.owned_scale[0] = uint8_t(127 + cuda::kFp8Pow2Min);
  EXPECT_TRUE(cuda::pack_fp8(w).pow2_scales);
  w.owned_scale[0] = uint8_t(127 + cuda::kFp8Pow2Min - 1);  // 2^-125: the smallest codes would round in bf16
  EXPECT_FALSE(cuda::pack_fp8(w).pow2_scales);
  w.owned_scale[0] = uint8_t(127 + cuda::kFp8Pow2Max);
  EXPECT_TRUE(cuda::pack_fp8(w).pow2_scales);
  w.owned_scale[0] = uint8_t(127 + cuda::kFp8Pow2Max + 1);  // 448 * 2^120 overflows bf16
  Fp8Packed p = cuda::pack_fp8(w);
  EXPECT_FALSE(p.pow2_scales);
  expect_fp8_readback(w, p);  // the values themselves stay exact (fp32 scales)
}

TEST(ReleasePack, Fp8Errors) {
  auto err = [](const LinearWeight& w) { return qt::error_of([&] { cuda::pack_fp8(w); }); };
  {
    LinearWeight w = random_fp8(130, 272, 1, Fp8Scales::E8M0, "layers.1.attn.wq_a");
    w.owned_scale[3] = 0xff;
    const std::string e = err(w);
    EXPECT_NE(e.find("layers.1.attn.wq_a"), std::string::npos) << e;
    EXPECT_NE(e.find("0xFF"), std::string::npos) << e;
  }
  for (float bad : {NAN, INFINITY, -INFINITY, 0.0f}) {
    LinearWeight w = random_fp8(130, 272, 2, Fp8Scales::F32_ANY, "layers.2.attn.wo_b");
    std::memcpy(&w.owned_scale[4 * 2], &bad, 4);
    const std::string e = err(w);
    EXPECT_NE(e.find("layers.2.attn.wo_b"), std::string::npos) << bad << ": " << e;
    EXPECT_NE(e.find("finite and nonzero"), std::string::npos) << e;
  }
  {
    LinearWeight w = random_fp8(40, 64, 3, Fp8Scales::E8M0, "w.nan");
    w.owned[5 * 64 + 9] = 0xff;
    EXPECT_NE(err(w).find("NaN code at row 5, column 9"), std::string::npos) << err(w);
  }
  {
    LinearWeight w = random_fp8(40, 64, 4, Fp8Scales::E8M0, "w.shape");
    w.scale_cols = 2;
    EXPECT_NE(err(w).find("scale shape"), std::string::npos) << err(w);
  }
  {
    LinearWeight w = random_fp8(40, 72, 5, Fp8Scales::E8M0, "w.k");
    w.in_features = 70;  // not a multiple of 16
    EXPECT_NE(err(w).find("divisible by 16"), std::string::npos) << err(w);
  }
  {
    LinearWeight w = random_fp8(40, 64, 6, Fp8Scales::E8M0, "w.dtype");
    w.scale_dtype = DType::BF16;
    EXPECT_NE(err(w).find("F8_E8M0 or F32"), std::string::npos) << err(w);
  }
  LinearWeight m = random_mxfp4(16, 64, 7);
  EXPECT_NE(err(m).find("expected an FP8-block weight"), std::string::npos) << err(m);
}

// Every packed value equals the CPU expansion.
void expect_fp4_readback(const LinearWeight& w, const cuda::Nvfp4Packed& p) {
  std::vector<float> row(static_cast<size_t>(w.in_features));
  for (int64_t n = 0; n < w.out_features; ++n) {
    linear_expand_row(w, n, row.data());
    for (int64_t k = 0; k < w.in_features; ++k)
      ASSERT_EQ(cuda::packed_nvfp4_value(p, n, k), row[size_t(k)]) << w.name << " n=" << n << " k=" << k;
  }
}

TEST(ReleasePack, Mxfp4PackedValuesMatchCpuExpansion) {
  struct S {
    int64_t N, K;
    int e_lo, e_hi;
  };
  // The widest span the scale byte holds (32 binades), narrow spans, and the E8M0 extremes.
  for (S s : {S{40, 96, 100, 131}, S{33, 1056, 120, 126}, S{16, 64, 127, 127}, S{48, 128, 0, 31},
              S{24, 160, 221, 252}}) {
    SCOPED_TRACE(testing::Message() << s.N << "x" << s.K << " exponents " << s.e_lo << ".." << s.e_hi);
    LinearWeight w = random_mxfp4(s.N, s.K, uint64_t(s.N + s.K + s.e_lo), s.e_lo, s.e_hi);
    // make sure both ends of the range occur
    w.owned_scale[0] = uint8_t(s.e_lo);
    w.owned_scale[1] = uint8_t(s.e_hi);
    cuda::Nvfp4Packed p = cuda::pack_mxfp4(w);
    int ex = 0;
    EXPECT_EQ(std::frexp(p.scale_2, &ex), 0.5f) << "scale_2 must be a power of two";
    // the largest exponent sits at the top of the byte's window
    EXPECT_EQ(ex - 1, s.e_hi - 127 - (cuda::kScaleWindow - 1 - cuda::kScaleExpBias));
    expect_fp4_readback(w, p);
    // pack_nvfp4 (what upload_nvfp4 / upload_experts call) forwards MXFP4 to the same packing
    cuda::Nvfp4Packed q = cuda::pack_nvfp4(w);
    EXPECT_EQ(q.data, p.data);
    EXPECT_EQ(q.scales, p.scales);
    EXPECT_EQ(q.scale_2, p.scale_2);
  }
}

TEST(ReleasePack, Mxfp4Errors) {
  auto err = [](const LinearWeight& w) { return qt::error_of([&] { cuda::pack_nvfp4(w); }); };
  {
    LinearWeight w = random_mxfp4(32, 128, 1, 110, 120, "layers.4.ffn.experts.7.w2");
    w.owned_scale[0] = 110;
    w.owned_scale[1] = 142;  // 33 binades
    const std::string e = err(w);
    EXPECT_NE(e.find("layers.4.ffn.experts.7.w2"), std::string::npos) << e;
    EXPECT_NE(e.find("33 binades"), std::string::npos) << e;
  }
  {
    LinearWeight w = random_mxfp4(32, 128, 2, 110, 120, "layers.5.ffn.experts.1.w1");
    w.owned_scale[37] = 0xff;
    const std::string e = err(w);
    EXPECT_NE(e.find("layers.5.ffn.experts.1.w1"), std::string::npos) << e;
    EXPECT_NE(e.find("NaN code 0xFF"), std::string::npos) << e;
    EXPECT_NE(e.find("row 9, block 1"), std::string::npos) << e;
  }
  {
    LinearWeight w = random_mxfp4(16, 64, 3, 120, 126, "w.k");
    w.in_features = 48;  // not a multiple of 32
    EXPECT_NE(err(w).find("divisible by 32"), std::string::npos) << err(w);
  }
  {
    LinearWeight w = random_mxfp4(16, 64, 4, 120, 126, "w.dtype");
    w.scale_dtype = DType::F8_E4M3;
    EXPECT_NE(err(w).find("must be F8_E8M0"), std::string::npos) << err(w);
  }
  LinearWeight f = random_fp8(16, 64, 5, Fp8Scales::E8M0);
  EXPECT_NE(err(f).find("expected an NVFP4 or MXFP4 weight"), std::string::npos) << err(f);
}

}  // namespace
