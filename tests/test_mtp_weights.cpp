// Loading the MTP blocks (spec §8, `mtp.{i}.*`): shapes and formats checked like a layer's, a checkpoint
// without them still loads, and asking for MTP where there is none (or where a piece is missing or
// misshaped) is an error that names the problem.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/numeric.h"
#include "io/safetensors.h"
#include "model/inspect.h"
#include "model/model.h"
#include "mtp_fixture.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace cm;
using cm::test::error_of;
using json = nlohmann::json;

namespace {

using namespace cm::test::mtp;

}  // namespace

TEST(MtpWeights, LoadsTheBlockWithItsShapes) {
  const json cfg = release_config();
  const int64_t D = hidden_of(cfg);
  const std::vector<TensorData> ts = with_mtp_block(release_tensors(), D);
  const std::string d = write_checkpoint("ok", ts, cfg);
  auto m = model_load(d, with_mtp());
  ASSERT_EQ(m->weights.mtp.size(), 1u);
  EXPECT_EQ(checkpoint_mtp_blocks(m->store), 1);
  const MtpWeights& w = m->weights.mtp[0];
  const Config& c = m->config;
  EXPECT_EQ(w.e_proj.out_features, D);
  EXPECT_EQ(w.e_proj.in_features, D);
  EXPECT_EQ(w.h_proj.out_features, D);
  EXPECT_EQ(w.enorm.size(), size_t(D));
  EXPECT_EQ(w.hc_head_fn.size(), size_t(c.hc_mult * c.hc_mult * D));
  EXPECT_EQ(w.hc_head_base.size(), size_t(c.hc_mult));
  EXPECT_EQ(w.block.compressor, nullptr);
  EXPECT_EQ(w.block.indexer, nullptr);
  EXPECT_TRUE(w.block.tid2eid.empty());
  ASSERT_EQ(w.block.gate_bias.size(), size_t(c.n_routed_experts));
  // The values are the checkpoint's: the bias is layer 3's, the MTP norm the final norm.
  EXPECT_EQ(w.block.gate_bias, m->weights.layers[3].gate_bias);
  EXPECT_EQ(w.norm, m->weights.norm);
  EXPECT_EQ(w.block.experts.size(), size_t(c.n_routed_experts));
  // inspect counts the stored blocks and finds nothing wrong with them.
  const json r = inspect_checkpoint(d, {});
  EXPECT_EQ(r["mtp_blocks"].get<int64_t>(), 1);
  EXPECT_TRUE(r["problems"].empty()) << r["problems"].dump();
  EXPECT_NE(inspect_text(r).find("MTP blocks stored: 1 (the config names 1)"), std::string::npos) << inspect_text(r);
  // Without the option the same checkpoint loads and reads no MTP tensor.
  auto plain = model_load(d);
  EXPECT_TRUE(plain->weights.mtp.empty());
}

TEST(MtpWeights, ACheckpointWithoutThemLoadsButMtpIsRefused) {
  const json cfg = release_config();
  const std::string d = write_checkpoint("none", release_tensors(), cfg);
  EXPECT_EQ(model_load(d)->weights.mtp.size(), 0u);
  const std::string e = error_of([&] { model_load(d, with_mtp()); });
  EXPECT_NE(e.find("the checkpoint has no MTP weights (no 'mtp.0.*' tensors"), std::string::npos) << e;
  json c0 = cfg;
  c0["num_nextn_predict_layers"] = 0;
  c0["compress_ratios"] = json::array({0, 4, 128, 4});
  const std::string d0 = write_checkpoint("none0", release_tensors(), c0);
  const std::string e0 = error_of([&] { model_load(d0, with_mtp()); });
  EXPECT_NE(e0.find("num_nextn_predict_layers = 0"), std::string::npos) << e0;
  // DSpark draft stages instead of an MTP block: refused by name (the model itself still loads).
  std::vector<TensorData> ds = release_tensors();
  ds.push_back(copy_as(find(ds, "norm.weight"), "dspark.0.norm.weight"));
  const std::string dd = write_checkpoint("dspark", ds, cfg);
  const std::string ed = error_of([&] { model_load(dd, with_mtp()); });
  EXPECT_NE(ed.find("DSpark stages ('dspark.0.norm.weight')"), std::string::npos) << ed;
}

TEST(MtpWeights, MissingMisshapedAndCompressedBlocksAreNamed) {
  const json cfg = release_config();
  const int64_t D = hidden_of(cfg);
  const std::vector<TensorData> full = with_mtp_block(release_tensors(), D);
  std::vector<TensorData> ts = full;
  std::erase_if(ts, [](const TensorData& t) { return t.name == "mtp.0.h_proj.weight"; });
  std::string e = error_of([&] { model_load(write_checkpoint("miss", ts, cfg), with_mtp()); });
  EXPECT_NE(e.find("mtp.0.h_proj"), std::string::npos) << e;
  ts = full;
  std::erase_if(ts, [](const TensorData& t) { return t.name == "mtp.0.ffn.gate.bias"; });
  e = error_of([&] { model_load(write_checkpoint("bias", ts, cfg), with_mtp()); });
  EXPECT_NE(e.find("missing tensor 'mtp.0.ffn.gate.bias'"), std::string::npos) << e;
  ts = full;
  for (auto& t : ts)
    if (t.name == "mtp.0.hc_head_base") t = copy_as(find(full, "mtp.0.enorm.weight"), t.name);  // [D], not [hc]
  e = error_of([&] { model_load(write_checkpoint("shape", ts, cfg), with_mtp()); });
  EXPECT_NE(e.find("tensor 'mtp.0.hc_head_base' has shape"), std::string::npos) << e;
  // An MTP block with compressor tensors where V4's is sliding-window only.
  ts = full;
  for (const auto& t : full)
    if (t.name.rfind("layers.2.attn.compressor.", 0) == 0) ts.push_back(copy_as(t, "mtp.0." + t.name.substr(9)));
  e = error_of([&] { model_load(write_checkpoint("comp", ts, cfg), with_mtp()); });
  EXPECT_NE(e.find("MTP block 0: compress_ratio 0 in the config makes it sliding-window only, but the checkpoint has "
                   "compressor tensors ('mtp.0.attn.compressor."),
            std::string::npos)
      << e;
  json c4 = cfg;
  c4["compress_ratios"][4] = 4;
  e = error_of([&] { model_load(write_checkpoint("ratio", full, c4), with_mtp()); });
  EXPECT_NE(e.find("mtp.0: compress_ratio 4 in the config; MTP blocks with a compressor are not supported"),
            std::string::npos)
      << e;
}
