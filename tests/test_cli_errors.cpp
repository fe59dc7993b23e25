// The command line's own wording where CLI11 would speak (Serving II): value errors name the
// program, command and flag; a mistyped flag before the command gets a suggestion; help shows
// "Usage: clawmine CMD [OPTIONS]"; tokenize reads stdin like generate; serve takes -c/--ctx-size;
// -t beyond the cores warns.
#include <gtest/gtest.h>

#include <filesystem>

#include "cli_run.h"

using cm::test::RunOptions;
using cm::test::RunResult;

namespace {
const std::string kBin = CLAWMINE_BINARY;
RunResult cm_run(std::vector<std::string> args, const RunOptions& o = {}) {
  args.insert(args.begin(), kBin);
  return cm::test::run_program(args, o);
}
bool has(const std::string& hay, const std::string& needle) { return hay.find(needle) != std::string::npos; }
}  // namespace

TEST(CliErrors, ValueErrorsInOurWords) {
  RunResult n = cm_run({"generate", "-p", "x", "--n-predict", "abc"});
  EXPECT_EQ(n.code, 1);
  EXPECT_EQ(n.err, "clawmine generate: --n-predict: \"abc\" is not an integer\n");
  RunResult t = cm_run({"generate", "-p", "x", "--temp", "warm"});
  EXPECT_EQ(t.err, "clawmine generate: --temp: \"warm\" is not a number\n");
  RunResult c = cm_run({"serve", "-c", "big"});
  EXPECT_EQ(c.code, 1);
  EXPECT_EQ(c.err, "clawmine serve: --ctx-size: \"big\" is not an integer\n");
  for (const RunResult& r : {n, t, c}) EXPECT_FALSE(has(r.err, "Could not convert")) << r.err;
}

TEST(CliErrors, MistypedTopLevelFlag) {
  RunResult r = cm_run({"--versoin"});
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.err, "clawmine: unknown flag '--versoin' (did you mean '--version'?)\n");
  EXPECT_FALSE(has(r.err, "subcommand"));
}

TEST(CliErrors, HelpUsageLine) {
  RunResult all = cm_run({"help"});
  ASSERT_EQ(all.code, 0);
  EXPECT_TRUE(has(all.out, "Usage: clawmine CMD [OPTIONS]\n")) << all.out;
  RunResult gen = cm_run({"help", "generate"});
  EXPECT_TRUE(has(gen.out, "Usage: clawmine generate [OPTIONS]\n")) << gen.out;
  RunResult flag = cm_run({"serve", "--help"});
  EXPECT_EQ(flag.code, 0);
  EXPECT_TRUE(has(flag.out, "Usage: clawmine serve [OPTIONS]\n")) << flag.out;
  EXPECT_TRUE(has(flag.out, "--ctx-size")) << flag.out;
}

TEST(CliErrors, TokenizeReadsStdin) {
  RunOptions in;
  in.has_stdin = true;
  in.stdin_text = "hello world";
  RunResult flag = cm_run({"tokenize", "-p", "hello world"});
  ASSERT_EQ(flag.code, 0) << flag.err;
  RunResult piped = cm_run({"tokenize"}, in);
  EXPECT_EQ(piped.code, 0) << piped.err;
  EXPECT_EQ(piped.out, flag.out);
  RunResult dash = cm_run({"tokenize", "-f", "-"}, in);
  EXPECT_EQ(dash.code, 0) << dash.err;
  EXPECT_EQ(dash.out, flag.out);
}

TEST(CliErrors, ThreadsBeyondCoresWarn) {
  RunResult r = cm_run({"generate", "-p", "x", "-n", "1", "-t", "4000"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.err, "warning: -t 4000 exceeds the")) << r.err;
  RunResult ok = cm_run({"generate", "-p", "x", "-n", "1", "-t", "1"});
  EXPECT_FALSE(has(ok.err, "exceeds")) << ok.err;
}

// --kv-cache-dtype: fp8 runs on the CPU backend; the CUDA backend refuses it by name before loading;
// an unknown value is a value error naming the choices.
TEST(CliErrors, KvCacheDtype) {
  RunResult ok = cm_run({"generate", "-p", "Once", "-n", "4", "--device", "cpu", "--kv-cache-dtype", "fp8", "--temp", "0"});
  EXPECT_EQ(ok.code, 0) << ok.err;
  EXPECT_FALSE(ok.out.empty());
  RunResult gpu = cm_run({"generate", "-p", "Once", "-n", "4", "--device", "cuda", "--kv-cache-dtype", "fp8"});
  EXPECT_EQ(gpu.code, 1);
  EXPECT_TRUE(has(gpu.err, "--kv-cache-dtype fp8: not built for the CUDA backend yet")) << gpu.err;
  RunResult bad = cm_run({"generate", "-p", "Once", "--kv-cache-dtype", "int4"});
  EXPECT_EQ(bad.code, 1);
  EXPECT_TRUE(has(bad.err, "--kv-cache-dtype")) << bad.err;
}

// serve --gpus N before anything loads: a build without NCCL, or without a GPU, says so by name.
TEST(CliErrors, GpusNamesWhatIsMissing) {
  RunResult r = cm_run({"serve", "--gpus", "2", "--device", "cpu", "--port", "0"});
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(has(r.err, "--gpus")) << r.err;
  EXPECT_TRUE(has(r.err, "NCCL") || has(r.err, "--device cuda")) << r.err;
  RunResult bad = cm_run({"serve", "--gpus", "-3"});
  EXPECT_EQ(bad.code, 1);
  EXPECT_TRUE(has(bad.err, "--gpus")) << bad.err;
}
