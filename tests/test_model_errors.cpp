// Routing unit test and bad-input tests for configs, checkpoints and the
// forward pass: each must produce a cm::Error naming the problem, not a crash.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "test_util.h"
#include "io/safetensors.h"
#include "model/cpu_backend.h"
#include "model/model.h"
#include "step_util.h"

namespace fs = std::filesystem;
using namespace cm;
using cm::test::error_of;
using json = nlohmann::json;

namespace {

const std::string kFixture = std::string(CLAWMINE_TEST_DATA) + "/golden/hf_hca_window";

json fixture_config() { return json::parse(std::ifstream(kFixture + "/config.json")); }

// Copies the fixture into a temp dir, letting `edit` change the tensor list.
std::string mutated_checkpoint(const std::string& tag, const std::function<void(std::vector<TensorData>&)>& edit,
                               const json* cfg = nullptr) {
  fs::path d = fs::temp_directory_path() / ("cm_bad_" + std::to_string(::getpid()) + "_" + tag);
  fs::remove_all(d);
  fs::create_directories(d);
  TensorStore s = TensorStore::open_dir(kFixture);
  std::vector<TensorData> ts;
  for (auto& [name, v] : s.all()) {
    if (name == "tokens" || name == "logits") continue;
    TensorData t;
    t.name = name;
    t.dtype = v->dtype;
    t.shape = v->shape;
    t.bytes.assign(v->data, v->data + v->nbytes);
    ts.push_back(std::move(t));
  }
  edit(ts);
  write_safetensors((d / "model.safetensors").string(), ts);
  std::ofstream(d / "config.json") << (cfg ? *cfg : fixture_config()).dump();
  return d.string();
}

}  // namespace

TEST(Routing, HashAndScoreRouting) {
  Config c;
  c.n_routed_experts = 6;
  c.n_experts_per_tok = 2;
  c.routed_scaling_factor = 1.5;
  LayerWeights lw;
  const float logits[2 * 6] = {0.1f, 2.0f, -1.0f, 0.5f, 3.0f, 0.0f, 1.0f, 1.0f, 1.0f, 1.0f, -5.0f, 0.2f};
  auto sps = [](float v) { return std::sqrt(v > 20 ? v : std::log1p(std::exp(v))); };
  // score routing: the bias changes the choice but not the weights
  lw.gate_bias = {0, 0, 10, 0, 0, 0};
  int32_t toks[2] = {0, 1};
  std::vector<int32_t> idx(4);
  std::vector<float> w(4);
  moe_route(c, lw, toks, logits, 2, idx.data(), w.data());
  EXPECT_EQ(idx[0], 2);  // biased to the top
  EXPECT_EQ(idx[1], 4);
  float s2 = sps(-1.0f), s4 = sps(3.0f);
  EXPECT_NEAR(w[0], s2 / (s2 + s4) * 1.5f, 1e-6);
  EXPECT_NEAR(w[1], s4 / (s2 + s4) * 1.5f, 1e-6);
  // token 1: expert 2 biased first, then the tie among 0,1,3 goes to the lowest id
  EXPECT_EQ(idx[2], 2);
  EXPECT_EQ(idx[3], 0);
  // hash routing: the table decides, weights still from the scores
  lw.gate_bias.clear();
  lw.tid2eid = {5, 1, 3, 0};
  moe_route(c, lw, toks, logits, 2, idx.data(), w.data());
  EXPECT_EQ(idx, (std::vector<int32_t>{5, 1, 3, 0}));
  float a = sps(0.0f), b = sps(2.0f);
  EXPECT_NEAR(w[0], a / (a + b) * 1.5f, 1e-6);
}

TEST(BadConfig, EachProblemIsNamed) {
  json base = fixture_config();
  auto err = [&](const std::function<void(json&)>& f) {
    json j = base;
    f(j);
    return error_of([&] { config_from_json(j, "cfg.json"); });
  };
  EXPECT_EQ(err([](json&) {}), "");
  EXPECT_NE(err([](json& j) { j["layer_types"][1] = "fancy_attention"; }).find("unknown layer type 'fancy_attention'"),
            std::string::npos);
  EXPECT_NE(err([](json& j) { j["layer_types"].erase(0); }).find("layer_types must list 3"), std::string::npos);
  EXPECT_NE(err([](json& j) { j.erase("hidden_size"); }).find("missing required key 'hidden_size'"), std::string::npos);
  EXPECT_NE(err([](json& j) { j["num_attention_heads"] = -4; }).find("'num_attention_heads' = -4"), std::string::npos);
  EXPECT_NE(err([](json& j) { j["o_groups"] = 3; }).find("not divisible by o_groups"), std::string::npos);
  EXPECT_NE(err([](json& j) { j["num_experts_per_tok"] = 99; }).find("num_experts_per_tok"), std::string::npos);
  EXPECT_NE(err([](json& j) { j["model_type"] = "llama"; }).find("not a DeepSeek-V4"), std::string::npos);
  EXPECT_NE(err([](json& j) { j["mlp_layer_types"][0] = "dense"; }).find("unknown MLP layer type"), std::string::npos);
  EXPECT_NE(err([](json& j) { j["compress_rates"]["heavily_compressed_attention"] = 1; }).find("compress_rates"),
            std::string::npos);
  EXPECT_NE(err([](json& j) { j["rope_parameters"]["compress"]["rope_type"] = "longrope"; }).find("not supported"),
            std::string::npos);
  // release spelling
  json rel = json::parse(std::ifstream(std::string(CLAWMINE_TEST_DATA) + "/golden/release_real_ratios/config.json"));
  Config rc = config_from_json(rel);
  EXPECT_EQ(rc.spelling, "release");
  ASSERT_EQ(rc.attn_kinds.size(), 4u);
  EXPECT_EQ(rc.attn_kinds[2], AttnKind::HCA);
  EXPECT_EQ(rc.moe_kinds[1], MoeKind::HASH);
  EXPECT_EQ(rc.moe_kinds[2], MoeKind::SCORE);
  EXPECT_TRUE(rc.rope_compress.yarn);
  EXPECT_FALSE(rc.rope_main.yarn);
  json r2 = rel;
  r2["compress_ratios"][1] = 8;
  EXPECT_NE(error_of([&] { config_from_json(r2); }).find("compress_ratios[1] = 8 is not a known ratio"),
            std::string::npos);
  r2 = rel;
  r2["compress_ratios"].erase(0);
  r2["compress_ratios"].erase(0);
  EXPECT_NE(error_of([&] { config_from_json(r2); }).find("compress_ratios has 3 entries"), std::string::npos);
  r2 = rel;
  r2["layer_types"] = base["layer_types"];
  EXPECT_NE(error_of([&] { config_from_json(r2); }).find("one spelling"), std::string::npos);
}

TEST(BadCheckpoint, MissingTensorIsNamed) {
  std::string d = mutated_checkpoint("missing", [](std::vector<TensorData>& ts) {
    std::erase_if(ts, [](const TensorData& t) { return t.name == "model.layers.1.attn.wq_b.weight"; });
  });
  std::string e = error_of([&] { model_load(d); });
  EXPECT_NE(e.find("missing tensor 'model.layers.1.attn.wq_b.weight'"), std::string::npos) << e;
  EXPECT_NE(e.find("[128, 32]"), std::string::npos) << e;
}

TEST(BadCheckpoint, WrongShapeIsNamed) {
  std::string d = mutated_checkpoint("shape", [](std::vector<TensorData>& ts) {
    for (auto& t : ts)
      if (t.name == "model.layers.0.attn.compressor.ape") t.shape = {8, 64};  // same bytes, wrong shape
  });
  std::string e = error_of([&] { model_load(d); });
  EXPECT_NE(e.find("'model.layers.0.attn.compressor.ape' has shape [8, 64], expected [16, 32]"), std::string::npos)
      << e;
}

TEST(BadCheckpoint, NonFiniteAndBadRoutingTable) {
  std::string d = mutated_checkpoint("nan", [](std::vector<TensorData>& ts) {
    for (auto& t : ts)
      if (t.name == "model.layers.2.attn.attn_sink") {
        float nan = NAN;
        std::memcpy(t.bytes.data() + 4, &nan, 4);
      }
  });
  EXPECT_NE(error_of([&] { model_load(d); }).find("'model.layers.2.attn.attn_sink' holds a non-finite value"),
            std::string::npos);
  d = mutated_checkpoint("tid", [](std::vector<TensorData>& ts) {
    for (auto& t : ts)
      if (t.name == "model.layers.0.ffn.gate.tid2eid") {
        int64_t bad = 99;
        std::memcpy(t.bytes.data() + 8 * 5, &bad, 8);
      }
  });
  std::string e = error_of([&] { model_load(d); });
  EXPECT_NE(e.find("routes to expert 99"), std::string::npos) << e;
}

TEST(BadCheckpoint, MixedSpellingRejected) {
  std::string d = mutated_checkpoint("mixed", [](std::vector<TensorData>& ts) {
    for (auto& t : ts)
      if (t.name == "model.norm.weight") t.name = "norm.weight";
  });
  EXPECT_NE(error_of([&] { model_load(d); }).find("mixes key spellings"), std::string::npos);
}

TEST(BadInput, TokensOutOfRangeAndTooLong) {
  auto m = model_load(kFixture);
  auto be = test::reserved_backend(*m, Device::CPU, 1, 4, 16);
  int32_t bad[2] = {3, 128};
  EXPECT_NE(error_of([&] { test::feed_chunks(*be, 0, bad, 2, 0, m->config.vocab_size); })
                .find("token id 128 is outside the vocabulary"),
            std::string::npos);
  EXPECT_EQ(be->slot_pos(0), 0);  // nothing consumed
  json j = fixture_config();
  j["max_position_embeddings"] = 8;
  std::string d = mutated_checkpoint("short", [](std::vector<TensorData>&) {}, &j);
  auto m2 = model_load(d);
  EXPECT_NE(error_of([&] { test::reserved_backend(*m2, Device::CPU, 1, 9, 9); }).find("outside [1, 8]"),
            std::string::npos);
  auto be2 = test::reserved_backend(*m2, Device::CPU, 1, 9, 8);
  std::vector<int32_t> toks(9, 4);
  EXPECT_NE(error_of([&] { test::feed_chunks(*be2, 0, toks.data(), 9, 0, m2->config.vocab_size); })
                .find("past the reserved context of 8"),
            std::string::npos);
}

// A weight that overflows fp32 mid-model: the step fails naming the first
// intermediate that went non-finite (layer and slot), not just "NaN logits".
TEST(BadInput, NonFiniteStepNamesFirstIntermediate) {
  json j = fixture_config();
  std::string d = mutated_checkpoint("overflow", [](std::vector<TensorData>& ts) {
    for (auto& t : ts)
      if (t.name == "model.layers.1.attn.q_norm.weight") {
        ASSERT_EQ(t.dtype, DType::F32);
        for (size_t i = 0; i + 4 <= t.bytes.size(); i += 4) {
          const float big = 3e38f;
          std::memcpy(t.bytes.data() + i, &big, 4);
        }
      }
  }, &j);
  auto m = model_load(d);
  auto be = test::reserved_backend(*m, Device::CPU, 1, 8, 16);
  std::vector<int32_t> toks = {3, 5, 7, 9};
  const std::string msg = error_of([&] { test::feed_chunks(*be, 0, toks.data(), 4, 0, m->config.vocab_size); });
  EXPECT_NE(msg.find("non-finite logits"), std::string::npos) << msg;
  EXPECT_NE(msg.find("l1.s0.q"), std::string::npos) << msg;
}
