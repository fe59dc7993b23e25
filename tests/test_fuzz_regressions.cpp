// The from-memory parser entry points the fuzz targets (fuzz/) drive, and one regression test
// per fuzzer finding: each feeds the input that broke a parser to the same function and checks
// the clear cm::Error (or the correct result) that the fix gives.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "chat/dsv4.h"
#include "common/error.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "test_util.h"

using namespace cm;
using cm::test::error_of;

namespace {
std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << path;
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}
const std::string kData = CLAWMINE_TEST_DATA;
}  // namespace

// parse_safetensors on a file's bytes sees exactly what SafetensorsFile sees on the file.
TEST(ParseFromMemory, SafetensorsMatchesFile) {
  const std::string path = kData + "/golden_quant_release/model-00002-of-00002.safetensors";
  std::string bytes = slurp(path);
  SafetensorsContents c = parse_safetensors(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), path);
  SafetensorsFile f(path);
  ASSERT_EQ(c.tensors.size(), f.tensors().size());
  ASSERT_GT(c.tensors.size(), 0u);
  for (const auto& [name, v] : f.tensors()) {
    const TensorView& m = c.tensors.at(name);
    EXPECT_EQ(m.dtype, v.dtype) << name;
    EXPECT_EQ(m.shape, v.shape) << name;
    ASSERT_EQ(m.nbytes, v.nbytes) << name;
    EXPECT_EQ(std::memcmp(m.data, v.data, v.nbytes), 0) << name;
    EXPECT_EQ(m.file, path);
  }
  EXPECT_EQ(c.metadata, f.metadata());
}

TEST(ParseFromMemory, SafetensorsTooShortNamesSource) {
  const uint8_t b[4] = {1, 2, 3, 4};
  EXPECT_EQ(error_of([&] { parse_safetensors(b, 4, "mem.safetensors"); }),
            "mem.safetensors: truncated safetensors file (4 bytes, no header length)");
}

TEST(ParseFromMemory, IndexMatchesOpenDir) {
  const std::string dir = kData + "/golden_quant_release";
  auto by_file = parse_safetensors_index(slurp(dir + "/model.safetensors.index.json"), "index");
  TensorStore s = TensorStore::open_dir(dir);
  size_t n = 0;
  for (const auto& [file, names] : by_file) {
    n += names.size();
    for (const auto& name : names) EXPECT_NE(s.find(name), nullptr) << name;
  }
  EXPECT_EQ(n, s.all().size());
  EXPECT_EQ(by_file.size(), 2u);
}

TEST(ParseFromMemory, IndexErrorsNameTheSource) {
  EXPECT_EQ(error_of([] { parse_safetensors_index("{}", "m/index.json"); }), "m/index.json: missing the weight_map object");
  EXPECT_EQ(error_of([] { parse_safetensors_index(R"({"weight_map": {"a": 3}})", "m/index.json"); }),
            "m/index.json: weight_map entry 'a' is not a file name");
  EXPECT_EQ(error_of([] { parse_safetensors_index(R"({"weight_map": {"a": "../x"}})", "i"); }),
            "i: weight_map entry 'a' names a path outside the directory: '../x'");
  EXPECT_NE(error_of([] { parse_safetensors_index("{", "i"); }).find("i: not valid JSON"), std::string::npos);
}

TEST(ParseFromMemory, ConfigParseMatchesLoad) {
  const std::string dir = kData + "/golden/release_real_ratios";
  Config a = config_parse(slurp(dir + "/config.json"), dir + "/config.json");
  Config b = config_load(dir);
  EXPECT_EQ(a.num_layers, b.num_layers);
  EXPECT_EQ(a.hidden_size, b.hidden_size);
  EXPECT_EQ(a.attn_kinds, b.attn_kinds);
  EXPECT_EQ(a.moe_kinds, b.moe_kinds);
  EXPECT_EQ(a.rope_compress.factor, b.rope_compress.factor);
  EXPECT_EQ(a.spelling, "release");
  EXPECT_NE(error_of([] { config_parse("[1,", "c.json"); }).find("c.json: not valid JSON"), std::string::npos);
}

// fuzz_chat_encode: a messages list whose JSON has the wrong shape must give a cm::Error naming
// the field; nlohmann's bare type_error (value() on a non-string "type", operator[] with an index
// on an object or string) escaped before.
namespace {
std::string encode_error(const char* messages_json) {
  auto msgs = nlohmann::ordered_json::parse(messages_json);
  return error_of([&] { chat::encode_messages(msgs, {}); });
}
}  // namespace

TEST(FuzzRegressions, ChatContentPartTypeNotString) {
  EXPECT_EQ(encode_error(R"([{"role":"user","content":[{"type":1}]}])"),
            "chat: a content part must be an object with a string \"type\"");
  EXPECT_EQ(encode_error(R"([{"role":"user","content":["text"]}])"),
            "chat: a content part must be an object with a string \"type\"");
  EXPECT_EQ(encode_error(R"([{"role":"user","content":[{"type":"image"}]}])"),
            "chat: content part of type 'image' is not supported");
}

TEST(FuzzRegressions, ChatToolsNotAList) {
  EXPECT_EQ(encode_error(R"([{"role":"system","content":"x","tools":{"a":1}}])"),
            "chat: tools must be a list of {\"type\": \"function\", \"function\": {...}}");
  EXPECT_EQ(encode_error(R"([{"role":"system","content":"x","tools":"abc"}])"),
            "chat: tools must be a list of {\"type\": \"function\", \"function\": {...}}");
}

TEST(FuzzRegressions, ChatToolCallsNotAList) {
  EXPECT_EQ(encode_error(R"([{"role":"user","content":"q"},{"role":"assistant","content":"x","tool_calls":"abc"}])"),
            "chat: tool_calls must be a list");
  EXPECT_EQ(encode_error(R"([{"role":"user","content":"q"},{"role":"assistant","content":"x","tool_calls":{"a":{}}}])"),
            "chat: tool_calls must be a list");
}

TEST(FuzzRegressions, ChatToolResultPartTypeNotString) {
  // A tool result part without a string type is shown as unsupported, like any unknown part.
  auto msgs = nlohmann::ordered_json::parse(R"([{"role":"user","content":"q"},{"role":"tool","content":[{"type":5}]}])");
  std::string p = chat::encode_messages(msgs, {});
  EXPECT_NE(p.find("<tool_result>[Unsupported ]</tool_result>"), std::string::npos) << p;
}
