// End to end on the quantized golden fixtures (tools/make_golden_quant.py):
// logits against transformers run with the dequantized weights (one prefill
// and chunked), quantize -> load -> logits, calibration, inspect, and the
// RAM an NVFP4 model holds against its F32 source.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "model/model.h"
#include "step_util.h"
#include "runtime/calibrate.h"
#include "model/inspect.h"
#include "quant/quantize.h"
#include "quant/validate.h"
#include "quant_test_util.h"

namespace fs = std::filesystem;
using namespace cm;
using namespace qt;

namespace {

const std::string kData = CLAWMINE_TEST_DATA;

using test::Expected;
using test::read_expected;

std::vector<float> run_logits(const Model& m, const std::vector<int32_t>& toks, int64_t chunk,
                              ActQuant aq = ActQuant::NONE) {
  BackendOptions bo;
  bo.act_quant = aq;
  return test::cpu_logits(m, toks, chunk, bo);
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double d = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) d = std::max(d, std::fabs(double(a[i]) - double(b[i])));
  return d;
}

// Sum of stored_bytes over every linear of the model (what the weights hold in RAM).
size_t linear_bytes(const Weights& w) {
  size_t s = w.head.stored_bytes() + w.embed.stored_bytes();
  for (const LayerWeights& l : w.layers) {
    for (const LinearWeight* p : {&l.wq_a, &l.wq_b, &l.wkv, &l.wo_a, &l.wo_b, &l.gate}) s += p->stored_bytes();
    if (l.compressor) s += l.compressor->wkv.stored_bytes() + l.compressor->wgate.stored_bytes();
    if (l.indexer)
      s += l.indexer->wq_b.stored_bytes() + l.indexer->weights_proj.stored_bytes() +
           l.indexer->comp.wkv.stored_bytes() + l.indexer->comp.wgate.stored_bytes();
    for (const ExpertWeights& e : l.experts) s += e.w1.stored_bytes() + e.w2.stored_bytes() + e.w3.stored_bytes();
    if (l.has_shared) s += l.shared.w1.stored_bytes() + l.shared.w2.stored_bytes() + l.shared.w3.stored_bytes();
  }
  return s;
}

// Writes an F32 copy of a checkpoint with every quantized linear dequantized
// (through load_linear + linear_expand_row) and no quantization_config.
void write_dequantized(const std::string& src, const std::string& dst) {
  TensorStore st = TensorStore::open_dir(src);
  std::vector<TensorData> out;
  std::set<std::string> skip;
  for (const auto& [name, t] : st.all()) {
    if (name.size() < 7 || name.compare(name.size() - 7, 7, ".weight") != 0) continue;
    std::string m = name.substr(0, name.size() - 7);
    auto f = stored_linear_format(st, m);
    if (!f || *f == WeightFormat::F32 || *f == WeightFormat::BF16 || *f == WeightFormat::F16) continue;
    const bool packed = t->dtype == DType::U8 || t->dtype == DType::I8;
    int64_t N = t->shape[0], K = t->shape[1] * (packed ? 2 : 1);
    LinearWeight w = load_linear(st, m, N, K);
    std::vector<float> v(size_t(N * K));
    for (int64_t n = 0; n < N; ++n) linear_expand_row(w, n, &v[size_t(n * K)]);
    out.push_back(tensor_f32(name, {N, K}, v.data()));
    for (const char* s : {".weight", ".scale", ".weight_scale", ".weight_scale_2", ".input_scale", ".weight_scale_inv"})
      skip.insert(m + s);
  }
  for (const auto& [name, t] : st.all())
    if (!skip.count(name)) out.push_back(TensorData{name, t->dtype, t->shape, std::vector<uint8_t>(t->data, t->data + t->nbytes)});
  fs::create_directories(dst);
  write_safetensors(dst + "/model.safetensors", out);
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(src + "/config.json"));
  cfg.erase("quantization_config");
  std::ofstream(dst + "/config.json") << cfg.dump(1);
}

}  // namespace

// Golden logits: clawmine on the stored quantized weights vs transformers on
// the dequantized ones, one prefill and in chunks.
TEST(QuantE2E, GoldenLogits) {
  for (const char* name : {"golden_quant_nvfp4", "golden_quant_release"}) {
    const std::string dir = kData + "/" + name;
    Expected e = read_expected(dir);
    auto m = model_load(dir);
    const LayerWeights& l1 = m->weights.layers[1];
    bool nv = std::string(name) == "golden_quant_nvfp4";
    EXPECT_EQ(l1.wq_a.format, nv ? WeightFormat::NVFP4 : WeightFormat::FP8_BLOCK) << name;
    EXPECT_EQ(l1.experts[3].w2.format, nv ? WeightFormat::NVFP4 : WeightFormat::MXFP4) << name;
    EXPECT_EQ(l1.shared.w1.format, nv ? WeightFormat::NVFP4 : WeightFormat::FP8_BLOCK) << name;
    double d1 = max_abs_diff(run_logits(*m, e.tokens, int64_t(e.tokens.size())), e.logits);
    double d2 = max_abs_diff(run_logits(*m, e.tokens, 7), e.logits);
    EXPECT_LE(d1, 1e-3) << name << " prefill";
    EXPECT_LE(d2, 1e-3) << name << " chunked";
    std::printf("[ golden ] %s: prefill max |diff| %.3g, chunked (7) %.3g\n", name, d1, d2);
  }
}

// --act-quant nvfp4 through the whole model: finite, and really different
// from weight-only (the per-linear numerics are tested in QuantActQuant).
TEST(QuantE2E, ActQuantForward) {
  const std::string dir = kData + "/golden_quant_nvfp4";
  Expected e = read_expected(dir);
  auto m = model_load(dir);
  std::vector<float> wo = run_logits(*m, e.tokens, 40);
  std::vector<float> a4 = run_logits(*m, e.tokens, 40, ActQuant::NVFP4);
  std::vector<float> a4c = run_logits(*m, e.tokens, 9, ActQuant::NVFP4);
  for (float v : a4) ASSERT_TRUE(std::isfinite(v));
  double d = max_abs_diff(wo, a4);
  EXPECT_GT(d, 1e-3);
  EXPECT_LE(max_abs_diff(a4, a4c), 1e-4);  // chunking does not change the activation quantization
}

// quantize -> load -> logits: a source whose weights are already NVFP4
// values (the golden fixture dequantized to F32) must come back bit-identical
// to the fixture's independently quantized bytes and give the source's logits.
TEST(QuantE2E, QuantizeRoundTrip) {
  const std::string fixture = kData + "/golden_quant_nvfp4";
  const std::string d = tmpdir("qrt");
  write_dequantized(fixture, d + "/src");
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) std::ofstream(d + "/src/" + f) << "{}";
  QuantizeOptions qo;
  qo.in_dir = d + "/src";
  qo.out_dir = d + "/out";
  qo.shard_bytes = 200 * 1024;
  std::FILE* devnull = std::fopen("/dev/null", "w");
  QuantizeSummary s = quantize_checkpoint(qo, {}, devnull);
  EXPECT_EQ(s.quantized, 4 * 5 + 4 * 3 + 4 * 8 * 3);  // attention 5, shared 3, 8 experts x 3, per layer
  EXPECT_EQ(s.defaulted, s.quantized);
  EXPECT_GT(s.shards, 1);
  EXPECT_TRUE(fs::exists(d + "/out/model.safetensors.index.json"));
  EXPECT_TRUE(fs::exists(d + "/out/tokenizer.json"));
  EXPECT_TRUE(fs::exists(d + "/out/tokenizer_config.json"));
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(d + "/out/config.json"));
  const auto& q = cfg["quantization_config"];
  EXPECT_EQ(q["quant_method"], "modelopt");
  EXPECT_EQ(q["quant_algo"], "NVFP4");
  EXPECT_EQ(q["group_size"], 16);
  EXPECT_TRUE(std::find(q["ignore"].begin(), q["ignore"].end(), "head") != q["ignore"].end());

  TensorStore fx = TensorStore::open_dir(fixture), out = TensorStore::open_dir(d + "/out");
  EXPECT_TRUE(validate_checkpoint(out, {}).empty());
  EXPECT_TRUE(check_quant_config(q, out).empty());
  int64_t tensors = 0, differing = 0;
  for (const auto& [name, t] : fx.all()) {
    if (name.find("input_scale") != std::string::npos) continue;
    const TensorView* o = out.find(name);
    ASSERT_TRUE(o) << name;
    EXPECT_EQ(o->dtype, t->dtype) << name;
    EXPECT_EQ(o->shape, t->shape) << name;
    ++tensors;
    if (name.find("weight_scale_2") != std::string::npos) {
      // amax(dequantized W) / 2688 reproduces the scalar up to one float rounding.
      float x, y;
      std::memcpy(&x, o->data, 4);
      std::memcpy(&y, t->data, 4);
      EXPECT_NEAR(x, y, std::fabs(y) * 2.5e-7) << name;
      continue;
    }
    bool diff = o->nbytes != t->nbytes || std::memcmp(o->data, t->data, t->nbytes) != 0;
    if (diff) std::printf("differs: %s\n", name.c_str());
    differing += diff;
  }
  EXPECT_EQ(differing, 0) << "of " << tensors;
  float in_s;
  std::memcpy(&in_s, out.get("model.layers.2.ffn.experts.5.w2.input_scale").data, 4);
  EXPECT_EQ(in_s, 1.0f);  // the documented default (amax 2688)

  Expected e = read_expected(fixture);
  auto src = model_load(d + "/src");
  auto qm = model_load(d + "/out");
  EXPECT_LE(max_abs_diff(run_logits(*src, e.tokens, 40), run_logits(*qm, e.tokens, 40)), 1e-4);
  EXPECT_LE(max_abs_diff(run_logits(*qm, e.tokens, 40), e.logits), 1e-3);

  // RAM held by the linears: NVFP4 vs the F32 source.
  size_t b_src = linear_bytes(src->weights), b_q = linear_bytes(qm->weights);
  std::printf("[ memory ] linear weights: F32 source %zu bytes, NVFP4 %zu bytes (%.2fx smaller)\n", b_src, b_q,
              double(b_src) / double(b_q));
  EXPECT_LT(b_q, b_src / 2);
  std::fclose(devnull);

  // Refusals: an existing non-empty output and the input as output.
  EXPECT_NE(error_of([&] { quantize_checkpoint(qo, {}, stderr); }).find("exists and is not empty"), std::string::npos);
}

// Calibration: input_scale = amax / 2688 of what each linear saw; a layer's
// experts share the max per projection kind, so every expert gets one.
TEST(QuantE2E, CalibratedInputScales) {
  const std::string fixture = kData + "/golden_quant_nvfp4";
  const std::string d = tmpdir("calib");
  write_dequantized(fixture, d + "/src");
  Expected e = read_expected(fixture);
  std::vector<std::vector<int32_t>> seqs = {std::vector<int32_t>(e.tokens.begin(), e.tokens.begin() + 25),
                                            std::vector<int32_t>(e.tokens.begin() + 25, e.tokens.end())};
  std::FILE* devnull = std::fopen("/dev/null", "w");
  std::map<std::string, float> amax = calibrate_input_amax(d + "/src", seqs, 16, devnull);

  // Independent record of the block inputs through the model's named intermediates.
  struct Rec : Observer {
    std::map<std::string, float> amax;
    void observe(const std::string& name, const float* x, const std::vector<int64_t>& shape) override {
      int64_t n = 1;
      for (int64_t s : shape) n *= s;
      float& a = amax[name];
      for (int64_t i = 0; i < n; ++i) a = std::max(a, std::fabs(x[i]));
    }
  } rec;
  auto m = model_load(d + "/src");
  BackendOptions bo;
  bo.observer = &rec;
  for (const auto& s : seqs)
    for (size_t i = 0; i < s.size(); i += 16) {
      std::vector<int32_t> piece(s.begin() + long(i), s.begin() + long(std::min(s.size(), i + 16)));
      test::cpu_logits(*m, piece, 0, bo);
    }
  for (int L = 0; L < 4; ++L) {
    std::string p = "model.layers." + std::to_string(L);
    EXPECT_EQ(amax.at(p + ".attn.wq_a"), rec.amax.at("l" + std::to_string(L) + ".s0.attn_in")) << L;
    EXPECT_EQ(amax.at(p + ".attn.wkv"), rec.amax.at("l" + std::to_string(L) + ".s0.attn_in")) << L;
    EXPECT_EQ(amax.at(p + ".ffn.shared_experts.w1"), rec.amax.at("l" + std::to_string(L) + ".s0.moe_in")) << L;
  }
  QuantizeOptions qo;
  qo.in_dir = d + "/src";
  qo.out_dir = d + "/out";
  QuantizeSummary s = quantize_checkpoint(qo, amax, devnull);
  std::fclose(devnull);
  EXPECT_EQ(s.defaulted, 0);
  TensorStore out = TensorStore::open_dir(d + "/out");
  auto scale = [&](const std::string& n) {
    float v;
    std::memcpy(&v, out.get(n + ".input_scale").data, 4);
    return v;
  };
  for (int L = 0; L < 4; ++L) {
    std::string p = "model.layers." + std::to_string(L);
    // Every token reaches some expert, so the w1/w3 group max is the amax of the MoE input.
    float in = rec.amax.at("l" + std::to_string(L) + ".s0.moe_in") / 2688.0f;
    float down = 0;
    for (int x = 0; x < 8; ++x) {
      auto it = amax.find(p + ".ffn.experts." + std::to_string(x) + ".w2");
      if (it != amax.end()) down = std::max(down, it->second);
    }
    ASSERT_GT(down, 0.0f);
    for (int x = 0; x < 8; ++x) {
      std::string ex = p + ".ffn.experts." + std::to_string(x);
      EXPECT_EQ(scale(ex + ".w1"), in) << ex;
      EXPECT_EQ(scale(ex + ".w3"), in) << ex;
      EXPECT_EQ(scale(ex + ".w2"), down / 2688.0f) << ex;
    }
    EXPECT_EQ(scale(p + ".attn.wq_a"), rec.amax.at("l" + std::to_string(L) + ".s0.attn_in") / 2688.0f);
  }
}

// Release-format source (FP8 blocks + MXFP4 experts, release spelling, shards)
// -> NVFP4 keeping the release key spelling, loadable and finite.
TEST(QuantE2E, QuantizeReleaseSource) {
  const std::string fixture = kData + "/golden_quant_release";
  const std::string d = tmpdir("qrel");
  QuantizeOptions qo;
  qo.in_dir = fixture;
  qo.out_dir = d + "/out";
  qo.exclude = {"layers.0.attn.wo_b"};
  std::FILE* devnull = std::fopen("/dev/null", "w");
  quantize_checkpoint(qo, {}, devnull);
  std::fclose(devnull);
  TensorStore out = TensorStore::open_dir(qo.out_dir);
  EXPECT_EQ(stored_linear_format(out, "layers.1.ffn.experts.2.w1"), WeightFormat::NVFP4);
  EXPECT_EQ(stored_linear_format(out, "layers.2.attn.wq_b"), WeightFormat::NVFP4);
  EXPECT_EQ(stored_linear_format(out, "layers.0.attn.wo_b"), WeightFormat::FP8_BLOCK);  // excluded: as stored
  EXPECT_TRUE(out.find("embed.weight") && out.find("hc_head_fn") && out.find("layers.0.attn.kv_norm.weight"));
  EXPECT_FALSE(out.find("layers.1.ffn.experts.2.w1.scale"));
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(qo.out_dir + "/config.json"));
  EXPECT_EQ(cfg["quantization_config"]["weight_block_size"], nlohmann::json::array({128, 128}));  // FP8 kept
  EXPECT_EQ(cfg["compress_ratios"], nlohmann::json::array({0, 4, 128, 0}));
  auto m = model_load(qo.out_dir);
  Expected e = read_expected(fixture);
  std::vector<float> l = run_logits(*m, e.tokens, 150);
  for (float v : l) ASSERT_TRUE(std::isfinite(v));
}

TEST(QuantE2E, InspectReport) {
  const std::string dir = kData + "/golden_quant_nvfp4";
  nlohmann::json r = inspect_checkpoint(dir, {});
  EXPECT_TRUE(r["problems"].empty()) << r["problems"].dump();
  EXPECT_EQ(r["config"]["num_layers"], 4);
  EXPECT_EQ(r["config"]["hash_layers"], 1);
  // Coverage re-derived from the stored tensors: NVFP4 params / all 2-D weights but the embedding.
  TensorStore st = TensorStore::open_dir(dir);
  int64_t lin = 0, nv = 0;
  for (const auto& [name, t] : st.all()) {
    if (name.size() < 7 || name.compare(name.size() - 7, 7, ".weight") != 0 || t->shape.size() != 2) continue;
    if (name == "model.embed_tokens.weight") continue;
    bool packed = t->dtype == DType::U8;
    int64_t p = t->shape[0] * t->shape[1] * (packed ? 2 : 1);
    lin += p;
    nv += packed ? p : 0;
  }
  EXPECT_EQ(r["linear_params"], lin);
  EXPECT_EQ(r["nvfp4_params"], nv);
  bool found = false;
  for (const auto& g : r["groups"])
    if (g["group"] == "layers.*.ffn.experts.*.w1") {
      found = true;
      EXPECT_EQ(g["format"], "NVFP4");
      EXPECT_EQ(g["modules"], 32);
      EXPECT_EQ(g["params"], 32 * 32 * 64);
      EXPECT_EQ(g["bytes"], 32 * (32 * 64 / 2 + 32 * 64 / 16 + 8));
    }
  EXPECT_TRUE(found);
  EXPECT_NE(inspect_text(r).find("NVFP4 coverage"), std::string::npos);

  // A broken copy: a NaN block scale and a missing input_scale, both listed; CLI exits 1.
  const std::string d = tmpdir("insp");
  fs::copy(dir, d, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  {
    // Rewrite the copy as one shard: one block scale set to the NaN code 0xFF, one input_scale dropped.
    TensorStore s2 = TensorStore::open_dir(d);
    std::vector<TensorData> ts;
    nlohmann::json idx = {{"metadata", nlohmann::json::object()}, {"weight_map", nlohmann::json::object()}};
    for (const auto& [name, t] : s2.all()) {
      if (name == "model.layers.2.ffn.experts.6.w3.input_scale") continue;
      TensorData td{name, t->dtype, t->shape, std::vector<uint8_t>(t->data, t->data + t->nbytes)};
      if (name == "model.layers.1.attn.wq_b.weight_scale") td.bytes[5] = 0xff;
      ts.push_back(std::move(td));
      idx["weight_map"][name] = "model-00001-of-00001.safetensors";
    }
    for (const auto& e : fs::directory_iterator(d))
      if (e.path().filename().string().rfind("model", 0) == 0) fs::remove(e.path());
    write_safetensors(d + "/model-00001-of-00001.safetensors", ts);
    std::ofstream(d + "/model.safetensors.index.json") << idx.dump();
  }
  nlohmann::json bad = inspect_checkpoint(d, {});
  std::vector<std::string> p = bad["problems"].get<std::vector<std::string>>();
  EXPECT_TRUE(any_line_has(p, {"'model.layers.1.attn.wq_b.weight_scale'", "NaN", "element 5"})) << bad["problems"].dump();
  EXPECT_TRUE(any_line_has(p, {"model.layers.2.ffn.experts.6.w3.input_scale", "layer 2 expert 6"})) << bad["problems"].dump();
  std::string cmd = std::string(CLAWMINE_BINARY) + " inspect " + d + " > /dev/null";
  EXPECT_EQ(WEXITSTATUS(std::system(cmd.c_str())), 1);
  cmd = std::string(CLAWMINE_BINARY) + " inspect " + dir + " --json > /dev/null";
  EXPECT_EQ(WEXITSTATUS(std::system(cmd.c_str())), 0);
}

// The CLI: a calibrated run reports its scales; text calibration files and an
// existing output are refused with exit 1 and a message naming the problem.
TEST(QuantE2E, QuantizeCli) {
  const std::string d = tmpdir("qcli");
  const std::string src = kData + "/golden_quant_release";
  Expected e = read_expected(src);
  {
    std::ofstream ids(d + "/ids.txt");
    for (size_t i = 0; i < 60; ++i) ids << e.tokens[i] << (i % 20 == 19 ? "\n" : ",");
    std::ofstream(d + "/text.txt") << "Hello world\n";
  }
  auto run = [&](const std::string& args, std::string* err) {
    std::string cmd = std::string(CLAWMINE_BINARY) + " quantize " + args + " 2> " + d + "/err.txt";
    int rc = WEXITSTATUS(std::system(cmd.c_str()));
    std::ifstream f(d + "/err.txt");
    err->assign(std::istreambuf_iterator<char>(f), {});
    return rc;
  };
  std::string err;
  EXPECT_EQ(run("--in " + src + " --out " + d + "/out --calib " + d + "/ids.txt --calib-seq-len 16", &err), 0) << err;
  EXPECT_NE(err.find("calibrate: 60/60 tokens"), std::string::npos) << err;
  EXPECT_NE(err.find("0 default"), std::string::npos) << err;
  EXPECT_TRUE(fs::exists(d + "/out/model.safetensors.index.json"));
  EXPECT_EQ(run("--in " + src + " --out " + d + "/out", &err), 1);
  EXPECT_NE(err.find("exists and is not empty"), std::string::npos) << err;
  EXPECT_EQ(run("--in " + src + " --out " + d + "/out2 --calib " + d + "/text.txt --calib-format ids", &err), 1);
  EXPECT_NE(err.find("'Hello' is not a token id"), std::string::npos) << err;
  EXPECT_EQ(run("--in " + src + " --out " + d + "/out2 --calib " + d + "/text.txt", &err), 1);
  EXPECT_NE(err.find("is text (not token ids) and needs the model's tokenizer"), std::string::npos) << err;
  // Text calibration through the model's tokenizer.
  const std::string txt = kData + "/golden/hf_text";
  EXPECT_EQ(run("--in " + txt + " --out " + d + "/out4 --calib " + txt + "/text.txt --calib-seq-len 64", &err), 0) << err;
  EXPECT_NE(err.find("0 default"), std::string::npos) << err;
  EXPECT_TRUE(fs::exists(d + "/out4/tokenizer.json"));
  EXPECT_EQ(run("--in " + src + " --out " + d + "/out3 --default-input-amax 0", &err), 1);
  EXPECT_NE(err.find("--default-input-amax"), std::string::npos) << err;
}

// quantize writes into a staging directory and renames it to --out only when
// complete: a write failing part-way (a file size limit stands in for a full
// disk; SIGXFSZ ignored so the write returns an error) leaves neither --out nor
// the staging directory. Runs the binary, since OpenMP cannot run in a fork.
TEST(QuantE2E, FailureMidwayLeavesNothing) {
  const std::string d = tmpdir("qfail");
  write_dequantized(kData + "/golden_quant_nvfp4", d + "/src");
  // Copied last, after every shard, the index and config.json: over the limit.
  std::ofstream(d + "/src/tokenizer.json") << std::string(1 << 20, ' ') << "{}";
  QuantizeOptions qo;
  qo.in_dir = d + "/src";
  qo.out_dir = d + "/out";
  const std::string cmd = "sh -c \"trap '' XFSZ; ulimit -f 256; exec " + std::string(CLAWMINE_BINARY) +
                          " quantize --in " + qo.in_dir + " --out " + qo.out_dir + " --shard-size-mb 0.03\" 2>" + d +
                          "/err.txt";
  const int st = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 1);
  std::ifstream ef(d + "/err.txt");
  const std::string err((std::istreambuf_iterator<char>(ef)), std::istreambuf_iterator<char>());
  EXPECT_NE(err.find("cannot copy"), std::string::npos) << err;
  fs::remove(d + "/err.txt");
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(d)) left.push_back(e.path().filename().string());
  EXPECT_EQ(left, std::vector<std::string>{"src"});
  // Without the limit the same run completes, into an existing empty --out too.
  fs::create_directories(d + "/out");
  std::FILE* devnull = std::fopen("/dev/null", "w");
  quantize_checkpoint(qo, {}, devnull);
  std::fclose(devnull);
  EXPECT_TRUE(fs::exists(d + "/out/config.json"));
  left.clear();
  for (const auto& e : fs::directory_iterator(d)) left.push_back(e.path().filename().string());
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"out", "src"}));
}
