// Routing unit test and bad-input tests for configs, checkpoints and the
// forward pass: each must produce a cm::Error naming the problem, not a crash.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "test_util.h"
#include "io/safetensors.h"
#include "backend/cpu/cpu_backend.h"
#include "model/model.h"
#include "step_util.h"

namespace fs = std::filesystem;
using namespace cm;
using cm::test::error_of;
using json = nlohmann::json;

namespace {

const std::string kFixture = std::string(CLAWMINE_TEST_DATA) + "/golden/hf_hca_window";

const std::string kRelease = std::string(CLAWMINE_TEST_DATA) + "/golden/release_real_ratios";

json fixture_config(const std::string& dir = kFixture) { return json::parse(std::ifstream(dir + "/config.json")); }

// Copies the fixture `src` into a temp dir, letting `edit` change the tensor list.
std::string mutated_checkpoint(const std::string& tag, const std::function<void(std::vector<TensorData>&)>& edit,
                               const json* cfg = nullptr, const std::string& src = kFixture) {
  fs::path d = fs::temp_directory_path() / ("cm_bad_" + std::to_string(::getpid()) + "_" + tag);
  fs::remove_all(d);
  fs::create_directories(d);
  std::vector<TensorData> ts = cm::test::checkpoint_tensors(src);
  edit(ts);
  write_safetensors((d / "model.safetensors").string(), ts);
  std::ofstream(d / "config.json") << (cfg ? *cfg : fixture_config(src)).dump();
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
  EXPECT_EQ(rc.ratio(0), 0);
  EXPECT_EQ(rc.ratio(1), 4);
  EXPECT_EQ(rc.ratio(2), 128);
  // The official rule: 0 = window only, 4 = CSA, any other positive ratio = HCA (per layer).
  json r2 = rel;
  r2["compress_ratios"][1] = 8;
  r2["compress_ratios"][2] = 64;
  Config c8 = config_from_json(r2);
  EXPECT_EQ(c8.attn_kinds[1], AttnKind::HCA);
  EXPECT_EQ(c8.ratio(1), 8);
  EXPECT_EQ(c8.ratio(2), 64);
  EXPECT_EQ(c8.attn_kinds[3], AttnKind::CSA);
  EXPECT_EQ(c8.ratio(3), 4);
  r2["compress_ratios"][1] = -4;
  EXPECT_NE(error_of([&] { config_from_json(r2); }).find("compress_ratios[1] = -4 is out of range"), std::string::npos);
  r2["compress_ratios"][1] = "4";
  EXPECT_NE(error_of([&] { config_from_json(r2); }).find("compress_ratios[1]: expected an integer, got the string"),
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

// Wrong-typed values name the file, the key and both types (never a bare json exception),
// and untrusted values are never printed whole.
TEST(BadConfig, WrongTypesAreNamed) {
  json base = fixture_config();
  auto err = [&](const std::function<void(json&)>& f) {
    json j = base;
    f(j);
    return error_of([&] { config_from_json(j, "config.json"); });
  };
  EXPECT_EQ(err([](json& j) { j["norm_topk_prob"] = "yes"; }),
            "config.json: key 'norm_topk_prob': expected a boolean, got a string");
  EXPECT_EQ(err([](json& j) { j["tie_word_embeddings"] = 1; }),
            "config.json: key 'tie_word_embeddings': expected a boolean, got an integer");
  EXPECT_EQ(err([](json& j) { j["scoring_func"] = json::array(); }),
            "config.json: key 'scoring_func': expected a string, got an array");
  EXPECT_EQ(err([](json& j) { j["hidden_size"] = json::object({{"a", std::string(100000, 'x')}}); }),
            "config.json: key 'hidden_size': expected an integer, got an object");
  EXPECT_NE(err([](json& j) { j["eos_token_id"] = json::array({1, "2"}); }).find("key 'eos_token_id'"),
            std::string::npos);
  EXPECT_NE(err([](json& j) { j["eos_token_id"] = 4294967296ull; }).find("outside the vocabulary"), std::string::npos);
  EXPECT_NE(err([](json& j) { j["quantization_config"] = "fp8"; }).find("key 'quantization_config': expected an object"),
            std::string::npos);
  std::string e = err([](json& j) { j["model_type"] = std::string(100000, 'q'); });
  EXPECT_NE(e.find("not a DeepSeek-V4 model"), std::string::npos);
  EXPECT_LT(e.size(), 300u) << "the untrusted value was printed whole";
  e = err([](json& j) { j["hidden_size"] = std::string(100000, 'q'); });
  EXPECT_LT(e.size(), 300u);
}

// config.json: nesting is bounded while parsing; a directory or FIFO is not a file.
TEST(BadConfig, DeepNestingAndNonFiles) {
  fs::path d = fs::temp_directory_path() / ("cm_cfg_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  json j = fixture_config();
  std::string deep = std::string(200000, '[') + std::string(200000, ']');
  std::string text = j.dump();
  text.insert(text.size() - 1, ",\"quantization_config\":{\"x\":" + deep + "}");
  std::ofstream(d / "config.json") << text;
  std::string e = error_of([&] { config_load(d.string()); });
  EXPECT_NE(e.find("config.json: JSON nested deeper than 64 levels"), std::string::npos) << e.substr(0, 300);
  fs::remove(d / "config.json");
  fs::create_directories(d / "config.json");
  e = error_of([&] { config_load(d.string()); });
  EXPECT_NE(e.find("config.json: is a directory"), std::string::npos) << e;
  fs::remove(d / "config.json");
  ASSERT_EQ(::mkfifo((d / "config.json").c_str(), 0600), 0);
  e = error_of([&] { config_load(d.string()); });  // must not block
  EXPECT_NE(e.find("not a regular file"), std::string::npos) << e;
  fs::remove_all(d);
}

// Part of the release rule (0 window, 4 CSA, other positive = HCA): the config's
// layer kinds must match the checkpoint, and a mismatch names the layer.
TEST(BadCheckpoint, LayerKindsMatchTheCheckpoint) {
  auto load_with = [&](const std::string& tag, int layer, int ratio,
                       const std::function<void(std::vector<TensorData>&)>& edit = {}) {
    json cfg = fixture_config(kRelease);
    cfg["compress_ratios"][layer] = ratio;
    std::string d = mutated_checkpoint(tag, edit ? edit : [](std::vector<TensorData>&) {}, &cfg, kRelease);
    return error_of([&] { model_load(d); });
  };
  std::string e = load_with("k8", 1, 8);
  EXPECT_NE(e.find("layer 1: compress_ratio 8 in the config makes it HCA"), std::string::npos) << e;
  EXPECT_NE(e.find("indexer tensors ('layers.1.attn.indexer."), std::string::npos) << e;
  e = load_with("k4", 2, 4);
  EXPECT_NE(e.find("layer 2: compress_ratio 4 in the config makes it CSA"), std::string::npos) << e;
  EXPECT_NE(e.find("no 'layers.2.attn.indexer.*' tensors"), std::string::npos) << e;
  e = load_with("k0", 2, 0);
  EXPECT_NE(e.find("layer 2: compress_ratio 0 in the config makes it sliding-window only, but the checkpoint has "
                   "compressor tensors"),
            std::string::npos)
      << e;
  e = load_with("k128", 0, 128);
  EXPECT_NE(e.find("no 'layers.0.attn.compressor.*' tensors"), std::string::npos) << e;
  e = load_with("k64", 2, 64);
  EXPECT_NE(e.find("layer 2 (HCA, compress ratio 64 in the config): tensor 'layers.2.attn.compressor.ape' has shape "
                   "[128, 32], expected [64, 32]"),
            std::string::npos)
      << e;
}

// An HCA ratio other than 128 loads and runs when the checkpoint agrees with it.
TEST(BadCheckpoint, OtherHcaRatioRuns) {
  json cfg = fixture_config(kRelease);
  cfg["compress_ratios"][2] = 64;
  std::string d = mutated_checkpoint(
      "hca64",
      [](std::vector<TensorData>& ts) {
        for (auto& t : ts)
          if (t.name == "layers.2.attn.compressor.ape") {
            t.bytes.resize(t.bytes.size() / size_t(t.shape[0]) * 64);
            t.shape[0] = 64;
          }
      },
      &cfg, kRelease);
  auto m = model_load(d);
  EXPECT_EQ(m->config.ratio(2), 64);
  EXPECT_EQ(m->config.attn_kinds[2], AttnKind::HCA);
  std::vector<int32_t> toks(130);
  for (size_t i = 0; i < toks.size(); ++i) toks[i] = int32_t((i * 37 + 5) % 128);
  std::vector<float> logits = test::cpu_logits(*m, toks, 0);
  ASSERT_FALSE(logits.empty());
  for (float v : logits) ASSERT_TRUE(std::isfinite(v));
}

// NaN/Inf in a float-format linear weight is refused at load, naming the tensor
// (small parameters were already checked; linears reached the logits).
TEST(BadCheckpoint, NonFiniteLinearWeightIsNamed) {
  std::string d = mutated_checkpoint("nanlin", [](std::vector<TensorData>& ts) {
    for (auto& t : ts)
      if (t.name == "model.layers.1.attn.wq_a.weight") {
        ASSERT_EQ(t.dtype, DType::F32);
        float nan = NAN;
        std::memcpy(t.bytes.data() + 4 * 7, &nan, 4);
      }
  });
  std::string e = error_of([&] { model_load(d); });
  EXPECT_NE(e.find("tensor 'model.layers.1.attn.wq_a.weight' holds 1 non-finite value(s) (NaN or Inf; first at "
                   "element 7)"),
            std::string::npos)
      << e;
  d = mutated_checkpoint(
      "inflin",
      [](std::vector<TensorData>& ts) {
        for (auto& t : ts)
          if (t.name == "layers.0.ffn.experts.1.w2.weight" || t.name == "embed.weight") {
            ASSERT_EQ(t.dtype, DType::BF16);
            t.bytes[2 * 3] = 0x80;  // +Inf in BF16: 0x7F80
            t.bytes[2 * 3 + 1] = 0x7f;
          }
      },
      nullptr, kRelease);
  e = error_of([&] { model_load(d); });
  EXPECT_NE(e.find("'embed.weight' holds 1 non-finite"), std::string::npos) << e;
  EXPECT_NE(e.find("'layers.0.ffn.experts.1.w2.weight' holds 1 non-finite"), std::string::npos) << e;
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
