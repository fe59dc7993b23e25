// load_linear for every stored format (spec §9.2, §9.3, §9.5) against an
// independent dequantization written here, linear_cpu on the stored formats,
// and validate_checkpoint / check_quant_config on good and broken checkpoints.
#include <gtest/gtest.h>

#include <random>

#include "quant/load_linear.h"
#include "quant/validate.h"
#include "quant_test_util.h"

using namespace cm;
using namespace qt;

namespace {

std::vector<uint8_t> random_bytes(size_t n, std::mt19937& rng, int lo, int hi) {
  std::uniform_int_distribution<int> d(lo, hi);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = uint8_t(d(rng));
  return v;
}
// Random positive finite E4M3 scale codes (0x00..0x7E).
std::vector<uint8_t> e4m3_scales(size_t n, std::mt19937& rng) { return random_bytes(n, rng, 0x20, 0x50); }

// Random NVFP4 linear at prefix with [N, K] logical shape.
void add_nvfp4(std::vector<TensorData>& ts, const std::string& p, int64_t N, int64_t K, std::mt19937& rng,
               float s2 = 0.01f, float in_s = 0.05f, bool with_input = true) {
  ts.push_back(raw(p + ".weight", DType::U8, {N, K / 2}, random_bytes(size_t(N * K / 2), rng, 0, 255)));
  ts.push_back(raw(p + ".weight_scale", DType::F8_E4M3, {N, K / 16}, e4m3_scales(size_t(N * K / 16), rng)));
  ts.push_back(scalar(p + ".weight_scale_2", s2));
  if (with_input) ts.push_back(scalar(p + ".input_scale", in_s));
}

// Independent dequantization of row n from the stored tensors.
std::vector<double> ref_row(const TensorStore& st, const std::string& p, WeightFormat f, int64_t n, int64_t K) {
  std::vector<double> out(static_cast<size_t>(K));
  const TensorView& w = st.get(p + ".weight");
  for (int64_t k = 0; k < K; ++k) {
    double v = 0;
    if (f == WeightFormat::NVFP4 || f == WeightFormat::MXFP4) {
      uint8_t byte = w.data[n * (K / 2) + k / 2];
      int code = (k % 2 == 0) ? (byte & 15) : (byte >> 4);
      if (f == WeightFormat::NVFP4) {
        const TensorView& s = st.get(p + ".weight_scale");
        float s2;
        std::memcpy(&s2, st.get(p + ".weight_scale_2").data, 4);
        v = ref_e2m1(code) * ref_e4m3(s.data[n * (K / 16) + k / 16]) * double(s2);
      } else {
        v = ref_e2m1(code) * ref_e8m0(st.get(p + ".scale").data[n * (K / 32) + k / 32]);
      }
    } else if (f == WeightFormat::FP8_BLOCK) {
      const TensorView* s = st.find(p + ".scale");
      if (!s) s = st.find(p + ".weight_scale_inv");
      int64_t cols = (K + 127) / 128, idx = (n / 128) * cols + k / 128;
      double sc;
      if (s->dtype == DType::F32) {
        float f32;
        std::memcpy(&f32, s->data + idx * 4, 4);
        sc = f32;
      } else {
        sc = ref_e8m0(s->data[idx]);
      }
      v = ref_e4m3(w.data[n * K + k]) * sc;
    }
    out[size_t(k)] = v;
  }
  return out;
}

void expect_matches_reference(const TensorStore& st, const std::string& p, WeightFormat f, int64_t N, int64_t K) {
  LinearWeight w = load_linear(st, p, N, K);
  ASSERT_EQ(w.format, f);
  EXPECT_EQ(w.data, st.get(p + ".weight").data);  // a view into the mapping, not a copy
  std::vector<float> row(static_cast<size_t>(K));
  std::vector<std::vector<double>> ref(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n) {
    ref[size_t(n)] = ref_row(st, p, f, n, K);
    linear_expand_row(w, n, row.data());
    for (int64_t k = 0; k < K; ++k) ASSERT_EQ(double(row[size_t(k)]), double(float(ref[size_t(n)][size_t(k)]))) << p << " " << n << " " << k;
  }
  // linear_cpu against a double-precision matmul on the reference rows.
  const int64_t M = 3;
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  std::vector<float> x(size_t(M * K)), y(size_t(M * N));
  for (auto& v : x) v = nd(rng);
  linear_cpu(w, x.data(), M, y.data());
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double acc = 0, mag = 0;
      for (int64_t k = 0; k < K; ++k) {
        acc += double(x[size_t(m * K + k)]) * ref[size_t(n)][size_t(k)];
        mag += std::fabs(double(x[size_t(m * K + k)]) * ref[size_t(n)][size_t(k)]);
      }
      EXPECT_NEAR(y[size_t(m * N + n)], acc, 1e-6 * mag + 1e-30) << p;
    }
}

}  // namespace

TEST(QuantLoad, AllFormatsMatchIndependentDequant) {
  std::string d = tmpdir("load");
  std::mt19937 rng(11);
  std::vector<TensorData> ts;
  add_nvfp4(ts, "layers.0.ffn.experts.0.w1", 5, 64, rng, 0.0123f);
  // MXFP4 release experts: I8 packed + E8M0 per 32.
  ts.push_back(raw("layers.0.ffn.experts.1.w1.weight", DType::I8, {4, 32}, random_bytes(4 * 32, rng, 0, 255)));
  ts.push_back(raw("layers.0.ffn.experts.1.w1.scale", DType::F8_E8M0, {4, 2}, random_bytes(8, rng, 110, 135)));
  // FP8 blocks with ragged edges: [130, 260] -> scales [2, 3]; E8M0 `.scale` and F32 `.weight_scale_inv`.
  std::vector<uint8_t> fp8 = random_bytes(130 * 260, rng, 0, 255);
  for (auto& b : fp8)
    if ((b & 0x7f) == 0x7f) b = 0x7e;
  ts.push_back(raw("layers.0.attn.wq_a.weight", DType::F8_E4M3, {130, 260}, fp8));
  ts.push_back(raw("layers.0.attn.wq_a.scale", DType::F8_E8M0, {2, 3}, random_bytes(6, rng, 115, 125)));
  ts.push_back(raw("model.layers.0.self_attn.q_a_proj.weight", DType::F8_E4M3, {130, 260}, fp8));
  ts.push_back(f32s("model.layers.0.self_attn.q_a_proj.weight_scale_inv", {2, 3}, {0.5f, 1e-3f, 3.f, 7.f, 0.25f, 1.f}));
  write_safetensors(d + "/model.safetensors", ts);
  TensorStore st = TensorStore::open_dir(d);
  expect_matches_reference(st, "layers.0.ffn.experts.0.w1", WeightFormat::NVFP4, 5, 64);
  expect_matches_reference(st, "layers.0.ffn.experts.1.w1", WeightFormat::MXFP4, 4, 64);
  expect_matches_reference(st, "layers.0.attn.wq_a", WeightFormat::FP8_BLOCK, 130, 260);
  expect_matches_reference(st, "model.layers.0.self_attn.q_a_proj", WeightFormat::FP8_BLOCK, 130, 260);
  LinearWeight nv = load_linear(st, "layers.0.ffn.experts.0.w1", 5, 64);
  EXPECT_EQ(nv.scale_2, 0.0123f);
  EXPECT_EQ(nv.input_scale, 0.05f);
  // ~4.5 bits per weight: 0.5 byte + 1/16 byte of scale + the scalar.
  EXPECT_EQ(nv.stored_bytes(), size_t(5 * 64 / 2 + 5 * 4 + 4));
  EXPECT_TRUE(validate_checkpoint(st, {}).empty());
}

TEST(QuantLoad, ShapeErrorsNameTheTensor) {
  std::string d = tmpdir("load");
  std::mt19937 rng(12);
  std::vector<TensorData> ts;
  add_nvfp4(ts, "a", 4, 32, rng);
  write_safetensors(d + "/model.safetensors", ts);
  TensorStore st = TensorStore::open_dir(d);
  EXPECT_NE(error_of([&] { load_linear(st, "a", 4, 64); }).find("'a.weight' has shape [4, 16], expected [4, 32]"), std::string::npos);
  EXPECT_NE(error_of([&] { load_linear(st, "b", 4, 32); }).find("missing tensor 'b.weight'"), std::string::npos);
}

// One checkpoint with a planted problem per tensor; every one must be listed.
TEST(QuantLoad, ValidateReportsEveryProblem) {
  std::string d = tmpdir("val");
  std::mt19937 rng(13);
  std::vector<TensorData> ts;
  add_nvfp4(ts, "layers.1.ffn.experts.0.w1", 4, 32, rng);
  ts[1].bytes[3] = 0x7f;  // NaN block scale
  add_nvfp4(ts, "layers.1.ffn.experts.1.w1", 4, 32, rng, 0.0f);                 // weight_scale_2 = 0
  add_nvfp4(ts, "layers.1.ffn.experts.2.w1", 4, 32, rng, 0.01f, NAN);           // input_scale NaN
  add_nvfp4(ts, "layers.1.ffn.experts.3.w2", 4, 32, rng, 0.01f, 0.f, false);    // input_scale missing
  add_nvfp4(ts, "layers.1.ffn.experts.4.w3", 4, 32, rng, INFINITY);             // weight_scale_2 inf
  ts.push_back(raw("layers.1.ffn.experts.5.w1.weight", DType::U8, {4, 16}, random_bytes(64, rng, 0, 255)));
  ts.push_back(raw("layers.1.ffn.experts.5.w1.weight_scale", DType::F8_E4M3, {4, 3}, e4m3_scales(12, rng)));  // misshaped
  ts.push_back(scalar("layers.1.ffn.experts.5.w1.weight_scale_2", 0.1f));
  ts.push_back(scalar("layers.1.ffn.experts.5.w1.input_scale", 0.1f));
  ts.push_back(raw("layers.1.ffn.experts.6.w1.weight", DType::I8, {4, 16}, random_bytes(64, rng, 0, 255)));  // no scale
  ts.push_back(raw("layers.1.ffn.experts.7.w1.weight", DType::I8, {4, 16}, random_bytes(64, rng, 0, 255)));
  std::vector<uint8_t> e8 = random_bytes(4, rng, 120, 130);
  e8[2] = 0xff;
  ts.push_back(raw("layers.1.ffn.experts.7.w1.scale", DType::F8_E8M0, {4, 1}, e8));  // E8M0 NaN
  std::vector<uint8_t> fp8(16 * 16, 0x38);
  fp8[5] = 0xff;
  ts.push_back(raw("layers.1.attn.wkv.weight", DType::F8_E4M3, {16, 16}, fp8));  // NaN weight code
  ts.push_back(f32s("layers.1.attn.wkv.scale", {1, 1}, {0.0f}));               // zero F32 block scale
  ts.push_back(raw("layers.1.attn.wo_a.weight", DType::F8_E4M3, {16, 16}, std::vector<uint8_t>(256, 0x38)));  // no scale
  ts.push_back(f32s("layers.1.attn.ghost.scale", {1, 1}, {1.0f}));              // orphan scale
  write_safetensors(d + "/model.safetensors", ts);
  TensorStore st = TensorStore::open_dir(d);
  std::vector<std::string> p = validate_checkpoint(st, {});
  std::string all;
  for (auto& l : p) all += l + "\n";
  EXPECT_TRUE(any_line_has(p, {"'layers.1.ffn.experts.0.w1.weight_scale'", "NaN", "element 3"})) << all;
  EXPECT_TRUE(any_line_has(p, {"'layers.1.ffn.experts.1.w1.weight_scale_2'", "not finite and > 0"})) << all;
  EXPECT_TRUE(any_line_has(p, {"'layers.1.ffn.experts.2.w1.input_scale'", "nan"})) << all;
  EXPECT_TRUE(any_line_has(p, {"'layers.1.ffn.experts.3.w2.input_scale'", "layer 1 expert 3"})) << all;
  EXPECT_TRUE(any_line_has(p, {"'layers.1.ffn.experts.4.w3.weight_scale_2'", "inf"})) << all;
  EXPECT_TRUE(any_line_has(p, {"'layers.1.ffn.experts.5.w1.weight_scale'", "[4, 3]", "expected [4, 2]"})) << all;
  EXPECT_TRUE(any_line_has(p, {"'layers.1.ffn.experts.6.w1.weight'", "no scales"})) << all;
  EXPECT_TRUE(any_line_has(p, {"'layers.1.ffn.experts.7.w1.scale'", "0xFF", "element 2"})) << all;
  EXPECT_TRUE(any_line_has(p, {"'layers.1.attn.wkv.weight'", "NaN"})) << all;
  EXPECT_TRUE(any_line_has(p, {"'layers.1.attn.wkv.scale'", "not finite and > 0"})) << all;
  EXPECT_TRUE(any_line_has(p, {"'layers.1.attn.wo_a.weight'", "no block scale"})) << all;
  EXPECT_TRUE(any_line_has(p, {"'layers.1.attn.ghost.scale'", "does not exist"})) << all;
  EXPECT_EQ(p.size(), 12u) << all;
  // load_linear refuses the same tensors with the same messages.
  EXPECT_NE(error_of([&] { load_linear(st, "layers.1.ffn.experts.1.w1", 4, 32); }).find("weight_scale_2"), std::string::npos);
  EXPECT_NE(error_of([&] { load_linear(st, "layers.1.ffn.experts.3.w2", 4, 32); }).find("layer 1 expert 3"), std::string::npos);
}

TEST(QuantLoad, DeriveMissingInputScale) {
  std::string d = tmpdir("derive");
  std::mt19937 rng(14);
  std::vector<TensorData> ts;
  add_nvfp4(ts, "model.layers.2.ffn.experts.0.w1", 4, 32, rng, 0.01f, 0.5f);
  add_nvfp4(ts, "model.layers.2.ffn.experts.0.w3", 4, 32, rng, 0.01f, 0.9f);
  add_nvfp4(ts, "model.layers.2.ffn.experts.0.w2", 4, 32, rng, 0.01f, 4.0f);
  add_nvfp4(ts, "model.layers.2.ffn.experts.1.w1", 4, 32, rng, 0.01f, 0.7f);
  add_nvfp4(ts, "model.layers.2.ffn.experts.2.w1", 4, 32, rng, 0.01f, 0.f, false);
  add_nvfp4(ts, "model.layers.3.ffn.experts.0.w1", 4, 32, rng, 0.01f, 99.f);  // another layer: not used
  add_nvfp4(ts, "model.layers.3.ffn.experts.1.w2", 4, 32, rng, 0.01f, 0.f, false);
  write_safetensors(d + "/model.safetensors", ts);
  TensorStore st = TensorStore::open_dir(d);
  auto strict = validate_checkpoint(st, {});
  EXPECT_EQ(strict.size(), 2u);
  EXPECT_TRUE(any_line_has(strict, {"model.layers.2.ffn.experts.2.w1.input_scale", "layer 2 expert 2 w1", "--derive-input-scale"}));
  LinearLoadOptions allow;
  allow.allow_missing_input_scale = true;
  auto lax = validate_checkpoint(st, allow);
  ASSERT_EQ(lax.size(), 1u);  // layer 3 has no other w2 to derive from
  EXPECT_TRUE(any_line_has(lax, {"model.layers.3.ffn.experts.1.w2.input_scale", "layer 3 expert 1 w2", "no other expert"}));
  LinearWeight w = load_linear(st, "model.layers.2.ffn.experts.2.w1", 4, 32, allow);
  EXPECT_EQ(w.input_scale, 0.9f);  // max over the layer's w1/w3 input scales, not w2 and not layer 3
  EXPECT_NE(error_of([&] { load_linear(st, "model.layers.2.ffn.experts.2.w1", 4, 32); }).find("layer 2 expert 2"), std::string::npos);
}

TEST(QuantLoad, GlobMatch) {
  EXPECT_TRUE(glob_match("*.attn.*", "layers.3.attn.wq_a"));
  EXPECT_FALSE(glob_match("*.attn.*", "layers.3.ffn.experts.0.w1"));
  EXPECT_TRUE(glob_match("mtp.*", "mtp.0.ffn.experts.1.w2"));
  EXPECT_FALSE(glob_match("mtp.*", "layers.0.mtp"));
  EXPECT_TRUE(glob_match("head", "head"));
  EXPECT_FALSE(glob_match("head", "heads"));
  EXPECT_TRUE(glob_match("layers.?.attn*", "layers.7.attn.wkv"));
  EXPECT_FALSE(glob_match("layers.?.attn*", "layers.17.attn.wkv"));
  EXPECT_TRUE(glob_match("*", ""));
  EXPECT_TRUE(glob_match("*a*b*c", "xxaxxbxxbc"));
}

TEST(QuantLoad, QuantConfigAgainstStored) {
  std::string d = tmpdir("qcfg");
  std::mt19937 rng(15);
  std::vector<TensorData> ts;
  add_nvfp4(ts, "layers.0.ffn.experts.0.w1", 4, 32, rng);
  add_nvfp4(ts, "layers.0.attn.wq_a", 4, 32, rng);
  ts.push_back(raw("layers.0.ffn.shared_experts.w1.weight", DType::F8_E4M3, {4, 32}, std::vector<uint8_t>(128, 0x38)));
  ts.push_back(raw("layers.0.ffn.shared_experts.w1.scale", DType::F8_E8M0, {1, 1}, {127}));
  write_safetensors(d + "/model.safetensors", ts);
  TensorStore st = TensorStore::open_dir(d);
  using J = nlohmann::json;
  // Release FP8 + NVFP4 experts, but the attention linear is NVFP4 and ignored.
  J mixed = {{"quant_method", "fp8"}, {"quant_algo", "MIXED_PRECISION"}, {"moe_quant_algo", "NVFP4"},
             {"group_size", 16}, {"weight_block_size", {128, 128}}, {"ignore", {"*.attn.*", "*.ffn.shared_experts.*", "head"}}};
  auto p = check_quant_config(mixed, st);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_TRUE(any_line_has(p, {"'layers.0.attn.wq_a'", "excludes it"}));
  // ModelOpt NVFP4 everywhere: the FP8 shared expert contradicts it unless ignored.
  J nv = {{"quant_method", "modelopt"}, {"quant_algo", "NVFP4"}, {"group_size", 16}, {"ignore", J::array()}};
  p = check_quant_config(nv, st);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_TRUE(any_line_has(p, {"'layers.0.ffn.shared_experts.w1'", "FP8-block", "declares it NVFP4"}));
  nv["exclude_modules"] = {"layers.*.ffn.shared_experts*"};
  p = check_quant_config(nv, st);
  ASSERT_EQ(p.size(), 1u);  // now FP8 without an FP8 declaration
  EXPECT_TRUE(any_line_has(p, {"shared_experts.w1", "declares no FP8"}));
  nv["group_size"] = 32;
  nv["quant_algo"] = "W4A8";
  p = check_quant_config(nv, st);
  EXPECT_TRUE(any_line_has(p, {"quant_algo 'W4A8'"}));
  p = check_quant_config(J(), st);
  EXPECT_TRUE(any_line_has(p, {"'layers.0.attn.wq_a' and 1 more", "declares no NVFP4"}));
  J bad_gs = {{"quant_method", "modelopt"}, {"quant_algo", "NVFP4"}, {"group_size", 32}, {"ignore", {"*shared*"}}};
  p = check_quant_config(bad_gs, st);
  EXPECT_TRUE(any_line_has(p, {"group_size 32"}));
}
