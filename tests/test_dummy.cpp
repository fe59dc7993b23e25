// --load-format dummy (model/dummy.h): the shipped V4-Flash and V4-Pro configs and their byte-level
// tokenizer, --num-layers, host weights for the CPU backend, and the command line end to end on a small
// config (the GPU path runs on the device: tests/gpu/test_dummy_cuda.cpp).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "cli_run.h"
#include "test_util.h"
#include "common/error.h"
#include "model/dummy.h"
#include "model/synthetic.h"
#include "tokenizer/tokenizer.h"

using namespace cm;
using cm::test::error_of;

namespace {
const std::string kModels = std::string(CLAWMINE_TEST_DATA) + "/../../models";

int count(const Config& c, AttnKind k) { return int(std::count(c.attn_kinds.begin(), c.attn_kinds.end(), k)); }

// A small release-spelled config (hidden 256, 3 layers: SWA, CSA, HCA) with the default model's tokenizer.
std::string tiny_dir() {
  const auto dir = std::filesystem::temp_directory_path() / ("cm_dummy_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  SyntheticShape s = synthetic_tiny_shape();
  s.layers = 3;
  s.ratios = {0, 4, 8};
  s.vocab = 4096;  // the tokenizer's
  s.max_position = 1024;
  s.hash_layers = 1;
  std::ofstream(dir / "config.json") << synthetic_config_json(s).dump(1);
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
    std::filesystem::copy_file(kModels + "/default/" + f, dir / f, std::filesystem::copy_options::overwrite_existing);
  return dir.string();
}
}  // namespace

TEST(Dummy, ShippedConfigsAreFlashAndPro) {
  const Config f = config_load(kModels + "/v4-flash"), p = config_load(kModels + "/v4-pro");
  EXPECT_EQ(f.num_layers, 43);
  EXPECT_EQ(f.hidden_size, 4096);
  EXPECT_EQ(count(f, AttnKind::CSA), 21);
  EXPECT_EQ(count(f, AttnKind::HCA), 20);
  EXPECT_EQ(count(f, AttnKind::SLIDING), 2);
  EXPECT_EQ(f.n_routed_experts, 256);
  EXPECT_EQ(f.num_nextn_predict_layers, 1);
  EXPECT_EQ(p.num_layers, 61);
  EXPECT_EQ(p.hidden_size, 7168);
  EXPECT_EQ(count(p, AttnKind::CSA), 30);
  EXPECT_EQ(count(p, AttnKind::HCA), 31);
  EXPECT_EQ(p.n_routed_experts, 384);
  EXPECT_EQ(p.index_topk, 1024);
  EXPECT_DOUBLE_EQ(p.routed_scaling_factor, 2.5);
  for (const Config* c : {&f, &p}) EXPECT_EQ(c->vocab_size, 129280);
}

TEST(Dummy, TheByteLevelTokenizerCoversTheVocabulary) {
  const Tokenizer t = Tokenizer::load(kModels + "/v4-flash");
  ASSERT_EQ(t.vocab_size(), 129280);
  EXPECT_EQ(t.token_id("<｜begin▁of▁sentence｜>"), 0);
  EXPECT_EQ(t.token_id("<｜end▁of▁sentence｜>"), 1);
  EXPECT_EQ(t.token_id("<｜User｜>"), 128803);
  EXPECT_EQ(t.token_id("<｜Assistant｜>"), 128804);
  EXPECT_EQ(t.token_id("</think>"), 128822);
  const std::string text = "Hello, wörld 42";
  const std::vector<int32_t> ids = t.encode(text);
  EXPECT_EQ(ids.size(), text.size());  // one token per byte
  EXPECT_EQ(t.decode(ids), text);
  EXPECT_EQ(t.encode("<｜User｜>hi"), (std::vector<int32_t>{128803, t.encode("h")[0], t.encode("i")[0]}));
  for (int32_t id = 0; id < 129280; ++id) ASSERT_FALSE(t.token_bytes(id).empty() && !t.is_special(id)) << id;
}

TEST(Dummy, KeepFirstLayers) {
  const Config f = config_load(kModels + "/v4-flash");
  const Config k = keep_first_layers(f, 4);
  EXPECT_EQ(k.num_layers, 4);
  ASSERT_EQ(k.attn_kinds.size(), 4u);
  EXPECT_EQ(k.attn_kinds[2], AttnKind::CSA);
  EXPECT_EQ(k.attn_kinds[3], AttnKind::HCA);
  EXPECT_EQ(k.ratio(3), 128);
  EXPECT_EQ(k.moe_kinds.size(), 4u);
  EXPECT_EQ(k.num_nextn_predict_layers, 1);  // the MTP block stays
  EXPECT_EQ(keep_first_layers(f, 0).num_layers, 43);
  EXPECT_NE(error_of([&] { keep_first_layers(f, 44); }).find("--num-layers 44 is outside [1, 43]"), std::string::npos);
  // Host weights for the kept layers; a shell without them for a backend that makes its own.
  const std::string dir = tiny_dir();
  const Config t = keep_first_layers(config_load(dir), 2);
  auto m = dummy_model(t, true);
  EXPECT_EQ(m->weights.layers.size(), 2u);
  EXPECT_FALSE(m->weights.embed.empty());
  EXPECT_TRUE(dummy_model(t, false)->weights.layers.empty());
  // Flash's weights: about 160 GB (the release's size), more than a test host holds.
  EXPECT_GT(dummy_host_bytes(f), size_t(140) << 30);
  EXPECT_LT(dummy_host_bytes(f), size_t(180) << 30);
}

TEST(Dummy, GenerateOnTheCpu) {
  const std::string dir = tiny_dir();
  using cm::test::run_program;
  const std::string bin = CLAWMINE_BINARY;
  auto r = run_program({bin, "generate", "-m", dir, "--load-format", "dummy", "--device", "cpu", "-p", "hello", "-n",
                        "6", "--temp", "0", "--ignore-eos"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("dummy weights (--load-format dummy), 3 of 3 layers"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("generation: 6 tokens"), std::string::npos) << r.err;
  // The same seed of weights: the same text; fewer layers: a model of its own.
  auto again = run_program({bin, "generate", "-m", dir, "--load-format", "dummy", "--device", "cpu", "-p", "hello",
                            "-n", "6", "--temp", "0", "--ignore-eos"});
  EXPECT_EQ(again.out, r.out);
  auto two = run_program({bin, "generate", "-m", dir, "--load-format", "dummy", "--num-layers", "2", "--device", "cpu",
                          "-p", "hello", "-n", "6", "--temp", "0", "--ignore-eos"});
  ASSERT_EQ(two.code, 0) << two.err;
  EXPECT_NE(two.err.find("2 of 3 layers"), std::string::npos);
  auto bad = run_program({bin, "generate", "-m", dir, "--load-format", "dummy", "--num-layers", "9", "--device", "cpu",
                          "-p", "x"});
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.err.find("--num-layers 9 is outside [1, 3]"), std::string::npos) << bad.err;
  auto real = run_program({bin, "generate", "-m", kModels + "/default", "--num-layers", "2", "--device", "cpu", "-p", "x"});
  EXPECT_NE(real.code, 0);
  EXPECT_NE(real.err.find("--num-layers keeps layers of dummy weights only"), std::string::npos) << real.err;
  auto fmt = run_program({bin, "generate", "-m", dir, "--load-format", "gguf", "-p", "x"});
  EXPECT_NE(fmt.code, 0);
}
