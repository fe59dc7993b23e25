// The clawmine binary end to end: logits file contents, chunking through the
// CLI, --layer-stats output, and that every error exits 1 with one line on
// stderr (never a signal).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include <fstream>
#include <nlohmann/json.hpp>

#include "io/safetensors.h"

namespace {

struct Result {
  int code = -1;
  std::string out, err;
};

Result run(const std::string& args) {
  const std::string err_file =
      (std::filesystem::temp_directory_path() / ("cm_cli_err_" + std::to_string(::getpid()))).string();
  std::string cmd = std::string(CLAWMINE_BINARY) + " " + args + " 2>" + err_file;
  Result r;
  FILE* p = popen(cmd.c_str(), "r");
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  int st = pclose(p);
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  FILE* e = fopen(err_file.c_str(), "r");
  while (e && (n = fread(buf.data(), 1, buf.size(), e)) > 0) r.err.append(buf.data(), n);
  if (e) fclose(e);
  return r;
}

const std::string kModel = std::string(CLAWMINE_TEST_DATA) + "/golden/hf_mixed_yarn";

}  // namespace

TEST(Cli, LogitsChunkedEqualsOneShot) {
  auto tmp = std::filesystem::temp_directory_path();
  std::string a = (tmp / ("cm_l1_" + std::to_string(::getpid()))).string(),
              b = (tmp / ("cm_l2_" + std::to_string(::getpid()))).string();
  Result r1 = run("logits -m " + kModel + " --tokens 5,17,42,9,9,100,3,77,8 -o " + a);
  ASSERT_EQ(r1.code, 0) << r1.err;
  Result r2 = run("logits -m " + kModel + " --tokens 5,17,42,9,9,100,3,77,8 --chunk 2 -t 1 -o " + b);
  ASSERT_EQ(r2.code, 0) << r2.err;
  cm::SafetensorsFile fa(a), fb(b);
  const cm::TensorView* la = fa.find("logits");
  ASSERT_TRUE(la);
  EXPECT_EQ(la->shape_str(), "[9, 128]");
  EXPECT_EQ(la->dtype, cm::DType::F32);
  const float* x = reinterpret_cast<const float*>(la->data);
  const float* y = reinterpret_cast<const float*>(fb.find("logits")->data);
  for (int i = 0; i < 9 * 128; ++i) EXPECT_NEAR(x[i], y[i], 1e-4);
}

TEST(Cli, LayerStatsPrintsEveryLayerAndStream) {
  Result r = run("logits -m " + kModel + " --tokens 5,17,42 --layer-stats -o /dev/null");
  ASSERT_EQ(r.code, 0) << r.err;
  for (const char* s : {"l0.s0.attn_out", "l0.s0.moe_out", "l0.s0.resid[0]", "l3.s0.resid[3]", "logits", "nan 0 inf 0"})
    EXPECT_NE(r.err.find(s), std::string::npos) << s << "\n" << r.err;
}

TEST(Cli, GenerateIsDeterministicPerSeed) {
  Result a = run("generate -m " + kModel + " --tokens 5,17 -n 12 --temp 1.0 --seed 7 --ignore-eos");
  Result b = run("generate -m " + kModel + " --tokens 5,17 -n 12 --temp 1.0 --seed 7 --ignore-eos");
  Result g = run("generate -m " + kModel + " --tokens 5,17 -n 12 --ignore-eos");
  ASSERT_EQ(a.code, 0) << a.err;
  EXPECT_EQ(a.out, b.out);
  int count = 0;
  for (char ch : g.out) count += ch == ' ';
  EXPECT_EQ(count, 11) << g.out;
  EXPECT_NE(a.err.find("tok/s"), std::string::npos);
}

TEST(Cli, ErrorsExitOneWithOneLine) {
  const char* cases[] = {
      "logits -m /nonexistent --tokens 1,2 -o /dev/null",
      "logits -m MODEL --tokens 1,,2 -o /dev/null",
      "logits -m MODEL --tokens 1,x -o /dev/null",
      "logits -m MODEL --tokens 1,999 -o /dev/null",
      "logits -m MODEL --tokens 1,2 --chunk -3 -o /dev/null",
      "logits -m MODEL --tokens 1,2 -o /nonexistent-dir/x.safetensors",
      "generate -m MODEL --tokens 1,2 --temp -1",
      "generate -m MODEL --tokens 1,2 --top-p 0",
      "generate -m MODEL --tokens 1,2 -n -5",
      "frobnicate",
  };
  for (std::string c : cases) {
    size_t at = c.find("MODEL");
    if (at != std::string::npos) c.replace(at, 5, kModel);
    Result r = run(c);
    EXPECT_EQ(r.code, 1) << c << "\n" << r.err;
    EXPECT_FALSE(r.err.empty()) << c;
  }
  Result r = run("logits -m /nonexistent --tokens 1 -o /dev/null");
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << r.err;
}

// Perplexity through tokenizer + model equals transformers' on the same text
// and protocol (tools/make_golden.py, fixture hf_text).
TEST(Cli, PerplexityMatchesTransformers) {
  const std::string dir = std::string(CLAWMINE_TEST_DATA) + "/golden/hf_text";
  auto expected = nlohmann::json::parse(std::ifstream(dir + "/expected.json"));
  Result r = run("perplexity -m " + dir + " -f " + dir + "/text.txt --ctx 32");
  ASSERT_EQ(r.code, 0) << r.err;
  double ppl = 0;
  long long scored = 0;
  ASSERT_EQ(std::sscanf(r.out.c_str(), "perplexity: %lf (%lld tokens scored", &ppl, &scored), 2) << r.out;
  EXPECT_EQ(scored, expected["tokens_scored"].get<long long>());
  EXPECT_NEAR(ppl / expected["perplexity"].get<double>(), 1.0, 1e-4) << r.out;
  EXPECT_NE(r.err.find("[4/4]"), std::string::npos) << r.err;
  Result bad = run("perplexity -m " + dir + " -f " + dir + "/text.txt --ctx 100000");
  EXPECT_EQ(bad.code, 1);
}
