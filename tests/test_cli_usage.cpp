// The clawmine command line as a llama.cpp user meets it (issue 16): errors
// that name the problem and suggest the fix, help, the default model found
// next to the binary (build tree and an installed prefix), prompts from -p,
// -f, stdin, escapes, -c, the random seed in the stats line, the chat
// commands, the perplexity error bar, --version without CUDA's startup cost,
// and the OpenMP wait policy the binary sets for itself.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>

#include "cli_run.h"

namespace fs = std::filesystem;
using cm::test::RunOptions;
using cm::test::RunResult;

namespace {

const std::string kBin = CLAWMINE_BINARY;
const std::string kDefault = fs::weakly_canonical(fs::path(CLAWMINE_TEST_DATA) / ".." / ".." / "models" / "default");
const std::string kFixture = std::string(CLAWMINE_TEST_DATA) + "/golden/hf_mixed_yarn";  // 128-token vocab

RunResult cm_run(std::vector<std::string> args, const RunOptions& o = {}) {
  args.insert(args.begin(), kBin);
  return cm::test::run_program(args, o);
}

RunOptions with_stdin(const std::string& text) {
  RunOptions o;
  o.has_stdin = true;
  o.stdin_text = text;
  return o;
}

bool has(const std::string& hay, const std::string& needle) { return hay.find(needle) != std::string::npos; }

long count_lines(const std::string& s) { return long(std::count(s.begin(), s.end(), '\n')); }

// "seed: N" of a stats line, or -1.
long long seed_of(const std::string& err) {
  std::smatch m;
  if (!std::regex_search(err, m, std::regex("seed: ([0-9]+)"))) return -1;
  return std::stoll(m[1]);
}

std::string temp_path(const std::string& name) {
  return (fs::temp_directory_path() / ("cm_usage_" + std::to_string(::getpid()) + "_" + name)).string();
}

}  // namespace

TEST(CliUsage, UnknownCommandNamedWithNearest) {
  RunResult r = cm_run({"genrate", "-p", "x"});
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(has(r.err, "unknown command 'genrate'")) << r.err;
  EXPECT_TRUE(has(r.err, "did you mean 'generate'?")) << r.err;
  EXPECT_EQ(count_lines(r.err), 1) << r.err;
  RunResult far = cm_run({"frobnicate"});
  EXPECT_EQ(far.code, 1);
  EXPECT_TRUE(has(far.err, "unknown command 'frobnicate'")) << far.err;
  EXPECT_FALSE(has(far.err, "did you mean")) << far.err;
  RunResult near = cm_run({"perplexty"});
  EXPECT_TRUE(has(near.err, "did you mean 'perplexity'?")) << near.err;
}

TEST(CliUsage, HelpAndHelpCommand) {
  RunResult all = cm_run({"help"});
  ASSERT_EQ(all.code, 0) << all.err;
  for (const char* c : {"generate", "chat", "perplexity", "tokenize", "logits", "quantize", "inspect"})
    EXPECT_TRUE(has(all.out, c)) << c << "\n" << all.out;
  RunResult gen = cm_run({"help", "generate"});
  ASSERT_EQ(gen.code, 0) << gen.err;
  for (const char* f : {"--ctx-size", "--no-escape", "--no-display-prompt", "--file", "--seed", "--temp"})
    EXPECT_TRUE(has(gen.out, f)) << f << "\n" << gen.out;
  EXPECT_FALSE(has(gen.out, "--stride"));  // the flags of generate, not of every command
  RunResult none = cm_run({});
  EXPECT_EQ(none.code, 1);
  EXPECT_TRUE(has(none.err, "generate")) << none.err;
  RunResult bad = cm_run({"help", "chta"});
  EXPECT_EQ(bad.code, 1);
  EXPECT_TRUE(has(bad.err, "did you mean 'chat'?")) << bad.err;
}

TEST(CliUsage, UnknownFlagsOnePerLineWithSuggestion) {
  RunResult r = cm_run({"generate", "--temperature", "0.5", "-p", "x", "--n-predit", "3", "--frobnicate"});
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(has(r.err, "unknown flag '--temperature' (did you mean '--temp'?)")) << r.err;
  EXPECT_TRUE(has(r.err, "unknown flag '--n-predit' (did you mean '--n-predict'?)")) << r.err;
  EXPECT_TRUE(has(r.err, "unknown flag '--frobnicate'\n")) << r.err;
  EXPECT_EQ(count_lines(r.err), 4) << r.err;  // three flags, one line each, and where to look
  // A value that starts with '-' is not a flag.
  RunResult neg = cm_run({"generate", "-m", kFixture, "--tokens", "5,17", "-n", "2", "-s", "-1"});
  EXPECT_EQ(neg.code, 0) << neg.err;
  RunResult chat = cm_run({"chat", "--thread", "2"});
  EXPECT_TRUE(has(chat.err, "did you mean '--threads'?")) << chat.err;
}

TEST(CliUsage, ModelFlagMeansTheSameEverywhere) {
  // Without -m: the embedded default model, found next to the binary.
  RunResult tok = cm_run({"tokenize", "-p", "And God said"});
  RunResult tok_m = cm_run({"tokenize", "-m", kDefault, "-p", "And God said"});
  ASSERT_EQ(tok.code, 0) << tok.err;
  EXPECT_EQ(tok.out, tok_m.out);
  EXPECT_EQ(tok.out, "299 388 391\n");
  RunResult det = cm_run({"detokenize", "--ids", "299 388 391"});
  EXPECT_EQ(det.out, "And God said");
  const std::string out = temp_path("logits.safetensors");
  RunResult lg = cm_run({"logits", "--tokens", "299,388", "-o", out});
  EXPECT_EQ(lg.code, 0) << lg.err;
  EXPECT_TRUE(fs::exists(out));
  fs::remove(out);
  // -m '' is an error in every command, never the default model.
  const std::vector<std::vector<std::string>> empties = {
      {"generate", "-m", "", "-p", "x"},           {"chat", "-m", ""},
      {"logits", "-m", "", "--tokens", "1", "-o", out}, {"perplexity", "-m", "", "-f", kDefault + "/heldout.txt"},
      {"tokenize", "-m", "", "-p", "x"},           {"detokenize", "-m", "", "--ids", "1"}};
  for (const auto& a : empties) {
    RunResult e = cm_run(a);
    EXPECT_EQ(e.code, 1) << a[0];
    EXPECT_TRUE(has(e.err, "-m/--model: empty directory name")) << a[0] << ": " << e.err;
    EXPECT_EQ(count_lines(e.err), 1) << e.err;
  }
  // Where a checkpoint is required, the error says so.
  RunResult q = cm_run({"quantize", "--out", temp_path("q")});
  EXPECT_EQ(q.code, 1);
  EXPECT_TRUE(has(q.err, "--in is required")) << q.err;
}

TEST(CliUsage, SeedIsRandomByDefaultAndPrinted) {
  const std::vector<std::string> base = {"generate", "-m", kFixture, "--tokens", "5,17", "-n", "16", "--temp", "1.0",
                                         "--ignore-eos"};
  RunResult a = cm_run(base), b = cm_run(base);
  ASSERT_EQ(a.code, 0) << a.err;
  const long long sa = seed_of(a.err), sb = seed_of(b.err);
  ASSERT_GE(sa, 0) << a.err;
  ASSERT_GE(sb, 0) << b.err;
  EXPECT_NE(sa, sb);  // 31 random bits: equal once in two billion runs
  // The printed seed repeats the run.
  auto again = base;
  again.insert(again.end(), {"-s", std::to_string(sa)});
  RunResult a2 = cm_run(again);
  EXPECT_EQ(a2.out, a.out);
  EXPECT_EQ(seed_of(a2.err), sa);
  auto minus1 = base;
  minus1.insert(minus1.end(), {"-s", "-1"});
  EXPECT_GE(seed_of(cm_run(minus1).err), 0);
  auto bad = base;
  bad.insert(bad.end(), {"--seed", "-2"});
  RunResult e = cm_run(bad);
  EXPECT_EQ(e.code, 1);
  EXPECT_TRUE(has(e.err, "-s/--seed must be -1 (random) or >= 0")) << e.err;
  // The stats line also gives the load time and the threads used.
  EXPECT_TRUE(std::regex_search(a.err, std::regex("load: [0-9.]+ s \\| prompt: 2 tokens"))) << a.err;
  auto t1 = base;
  t1.insert(t1.end(), {"-t", "1"});
  EXPECT_TRUE(has(cm_run(t1).err, "threads: 1 |"));
}

// Sampling where the logits are is the default; --no-sample-on-device (and CLAWMINE_SAMPLE_ON_DEVICE=0)
// samples on the host: the same text either way, and --sample-on-device still parses.
TEST(CliUsage, SampleOnDeviceGivesTheSameText) {
  const std::vector<std::string> base = {"generate", "-m", kFixture, "--tokens", "5,17", "-n", "16", "--temp", "0.9",
                                         "--top-k", "40", "--repeat-penalty", "1.2", "-s", "7", "--ignore-eos"};
  auto host_args = base;
  host_args.push_back("--no-sample-on-device");
  RunResult host = cm_run(host_args);
  ASSERT_EQ(host.code, 0) << host.err;
  RunResult d = cm_run(base);
  ASSERT_EQ(d.code, 0) << d.err;
  EXPECT_EQ(d.out, host.out);
  auto dev = base;
  dev.push_back("--sample-on-device");
  RunResult explicit_on = cm_run(dev);
  ASSERT_EQ(explicit_on.code, 0) << explicit_on.err;
  EXPECT_EQ(explicit_on.out, host.out);
  RunOptions env;
  env.set_env = {"CLAWMINE_SAMPLE_ON_DEVICE=0"};
  RunResult e = cm_run(base, env);
  ASSERT_EQ(e.code, 0) << e.err;
  EXPECT_EQ(e.out, host.out);
  EXPECT_FALSE(host.out.empty());
}

TEST(CliUsage, ContextSizeLimitsAndSaysSo) {
  RunResult r = cm_run({"generate", "-m", kFixture, "--tokens", "5,17", "-n", "100", "-c", "6", "--ignore-eos"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), ' '), 3) << r.out;  // 4 ids
  EXPECT_TRUE(has(r.err, "context limit reached: 6 tokens (-c 6)")) << r.err;
  // Stopping at -n is not a context limit.
  RunResult n = cm_run({"generate", "-m", kFixture, "--tokens", "5,17", "-n", "4", "-c", "6", "--ignore-eos"});
  EXPECT_FALSE(has(n.err, "context limit")) << n.err;
  // -n -1 runs to the end of the context.
  RunResult inf = cm_run({"generate", "-m", kFixture, "--tokens", "5,17", "-n", "-1", "-c", "9", "--ignore-eos"});
  EXPECT_EQ(std::count(inf.out.begin(), inf.out.end(), ' '), 6) << inf.out;
  RunResult big = cm_run({"generate", "-m", kFixture, "--tokens", "5", "-c", "99999999"});
  EXPECT_EQ(big.code, 1);
  EXPECT_TRUE(has(big.err, "-c/--ctx-size 99999999 exceeds the model's context of")) << big.err;
  RunResult full = cm_run({"generate", "-m", kFixture, "--tokens", "5,6,7,8", "-c", "4"});
  EXPECT_EQ(full.code, 1);
  EXPECT_TRUE(has(full.err, "the prompt has 4 tokens; the context (-c) holds 4")) << full.err;
  RunResult chat = cm_run({"chat", "-c", "99999999"}, with_stdin("/exit\n"));
  EXPECT_EQ(chat.code, 1);
  EXPECT_TRUE(has(chat.err, "exceeds the model's context")) << chat.err;
}

TEST(CliUsage, PromptFromFileStdinAndEscapes) {
  const std::vector<std::string> gen = {"generate", "-n", "6", "--temp", "0"};
  auto with = [&](std::vector<std::string> extra) {
    auto a = gen;
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  RunResult p = cm_run(with({"-p", "And God said"}));
  ASSERT_EQ(p.code, 0) << p.err;
  ASSERT_EQ(p.out.rfind("And God said", 0), 0u) << p.out;
  const std::string file = temp_path("prompt.txt");
  std::ofstream(file) << "And God said";
  RunResult f = cm_run(with({"-f", file}));
  EXPECT_EQ(f.out, p.out);
  EXPECT_EQ(cm_run(with({"-f", "-"}), with_stdin("And God said")).out, p.out);
  EXPECT_EQ(cm_run(gen, with_stdin("And God said")).out, p.out);  // piped, no -p
  fs::remove(file);
  // -p processes escapes unless --no-escape.
  RunResult esc = cm_run(with({"-p", "And\\tGod\\nsaid"}));
  EXPECT_EQ(esc.out.rfind("And\tGod\nsaid", 0), 0u) << esc.out;
  RunResult raw = cm_run(with({"-p", "And\\tGod", "--no-escape"}));
  EXPECT_EQ(raw.out.rfind("And\\tGod", 0), 0u) << raw.out;
  // --no-display-prompt prints only the generated text.
  RunResult nd = cm_run(with({"-p", "And God said", "--no-display-prompt"}));
  EXPECT_EQ(nd.out, p.out.substr(12)) << nd.out;
  // No prompt at all (stdin is an empty file, not a terminal): an empty prompt.
  RunResult none = cm_run(gen);
  EXPECT_EQ(none.code, 1);
  EXPECT_TRUE(has(none.err, "the prompt is empty")) << none.err;
  RunResult two = cm_run(with({"-p", "x", "-f", "y"}));
  EXPECT_EQ(two.code, 1);
  EXPECT_TRUE(has(two.err, "give one prompt")) << two.err;
  RunResult missing = cm_run(with({"-f", "/nonexistent/prompt.txt"}));
  EXPECT_EQ(missing.code, 1);
  EXPECT_TRUE(has(missing.err, "cannot read /nonexistent/prompt.txt")) << missing.err;
}

TEST(CliUsage, TokensAcceptWhatTokenizePrints) {
  RunResult ids = cm_run({"tokenize", "-p", "And God said"});
  ASSERT_EQ(ids.code, 0);
  std::string spaced = ids.out.substr(0, ids.out.size() - 1);
  RunResult a = cm_run({"generate", "--tokens", spaced, "-n", "5", "--temp", "0"});
  RunResult b = cm_run({"generate", "--tokens", "299,388,391", "-n", "5", "--temp", "0"});
  RunResult c = cm_run({"generate", "--tokens", ids.out, "-n", "5", "--temp", "0"});  // with the newline
  ASSERT_EQ(a.code, 0) << a.err;
  EXPECT_EQ(a.out, b.out);
  EXPECT_EQ(c.out, b.out);
  for (const char* bad : {"1,,2", "1, ,2", "1,", "x 1", ""}) {
    RunResult e = cm_run({"generate", "--tokens", bad, "-n", "1"});
    EXPECT_EQ(e.code, 1) << bad;
    EXPECT_TRUE(has(e.err, "--tokens")) << bad << ": " << e.err;
  }
}

TEST(CliUsage, ChatCommandsCutAndVerbose) {
  RunResult r = cm_run({"chat", "-n", "3", "--temp", "0", "--verbose"},
                       with_stdin("/help\n/frobnicate now\nAnd God said\n/reset\n/exit\n"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.out, "/reset ")) << r.out;  // the /help list
  EXPECT_TRUE(has(r.out, "unknown command /frobnicate (not sent to the model)")) << r.out;
  EXPECT_TRUE(has(r.out, "[cut: -n 3 tokens reached]")) << r.out;
  EXPECT_TRUE(has(r.out, "history cleared")) << r.out;
  EXPECT_TRUE(std::regex_search(r.err, std::regex("answer: 3 tokens, [0-9.]+ tok/s"))) << r.err;
  EXPECT_TRUE(std::regex_search(r.err, std::regex("seed [0-9]+"))) << r.err;
  // The unknown command never reached the model: one answer only.
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '['), 1) << r.out;
}

TEST(CliUsage, PerplexityFinalEstimateWithError) {
  const std::string dir = std::string(CLAWMINE_TEST_DATA) + "/golden/hf_text";
  RunResult r = cm_run({"perplexity", "-m", dir, "-f", dir + "/text.txt", "--ctx", "32"});
  ASSERT_EQ(r.code, 0) << r.err;
  double ppl = 0, est = 0, se = 0;
  ASSERT_EQ(std::sscanf(r.out.c_str(), "perplexity: %lf", &ppl), 1) << r.out;
  const size_t at = r.out.find("Final estimate: PPL = ");
  ASSERT_NE(at, std::string::npos) << r.out;
  ASSERT_EQ(std::sscanf(r.out.c_str() + at, "Final estimate: PPL = %lf +/- %lf", &est, &se), 2) << r.out;
  EXPECT_NEAR(est, ppl, 1e-3 * ppl);
  // The error of a mean over ~120 tokens of a near-random model: positive, a few percent of PPL.
  EXPECT_GT(se, 0.0);
  EXPECT_LT(se, 0.5 * ppl);
}

TEST(CliUsage, VersionSaysWhatWasBuiltAndStaysSmall) {
  RunResult r = cm_run({"--version"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("clawmine 0.", 0), 0u) << r.out;
  for (const char* s : {"\ncommit: ", "\nbuild type: ", "\nCUDA backend: "}) EXPECT_TRUE(has(r.out, s)) << s;
#ifdef CLAWMINE_HAVE_CUDA
  EXPECT_TRUE(has(r.out, "CUDA backend: on (GPU architectures: sm_")) << r.out;
#else
  EXPECT_TRUE(has(r.out, "CUDA backend: off")) << r.out;
#endif
  // No CUDA library is loaded for --version (cuBLAS alone maps ~220 MB). A sanitizer build has
  // no CUDA and its own runtime's footprint, so the bound is the plain build's.
#ifndef CLAWMINE_SANITIZED
  EXPECT_LT(r.max_rss_kb, 40 * 1024) << r.max_rss_kb << " KB";
#endif
}

TEST(CliUsage, BinarySetsPassiveOpenMPWait) {
  RunOptions o;
  o.unset_env = {"OMP_WAIT_POLICY"};
  o.set_env = {"OMP_DISPLAY_ENV=verbose"};
  RunResult r = cm_run({"help"}, o);
  ASSERT_EQ(r.code, 0) << r.err;
  // libgomp prints its settings at start; the run that does the work is the last.
  const size_t at = r.err.rfind("GOMP_SPINCOUNT = ");
  ASSERT_NE(at, std::string::npos) << r.err;
  EXPECT_EQ(r.err.substr(at, 20), "GOMP_SPINCOUNT = '0'") << r.err;
  // A policy the user exported is kept.
  RunOptions active = o;
  active.unset_env.clear();
  active.set_env.push_back("OMP_WAIT_POLICY=active");
  RunResult a = cm_run({"help"}, active);
  EXPECT_TRUE(has(a.err, "OMP_WAIT_POLICY = 'ACTIVE'")) << a.err;
}

// `cmake --install` puts the binary and the default model under a prefix; the
// installed binary finds the model relative to itself, also after the whole
// prefix is moved (no path is compiled in).
TEST(CliUsage, InstallFindsTheDefaultModel) {
  const fs::path prefix = temp_path("prefix");
  fs::remove_all(prefix);
  const std::string cmd = std::string("\"") + CLAWMINE_CMAKE + "\" --install \"" + CLAWMINE_BUILD_DIR +
                          "\" --prefix \"" + prefix.string() + "\" >/dev/null 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  EXPECT_TRUE(fs::exists(prefix / "bin" / "clawmine"));
  EXPECT_TRUE(fs::exists(prefix / "share" / "clawmine" / "models" / "default" / "config.json"));
  const fs::path moved = temp_path("moved");
  fs::remove_all(moved);
  fs::rename(prefix, moved);
  RunResult inst = cm::test::run_program({(moved / "bin" / "clawmine").string(), "generate", "-p", "And God said",
                                          "-n", "8", "--temp", "0"});
  RunResult here = cm_run({"generate", "-p", "And God said", "-n", "8", "--temp", "0"});
  ASSERT_EQ(inst.code, 0) << inst.err;
  EXPECT_EQ(inst.out, here.out);
  EXPECT_TRUE(has(inst.err, "generation: 8 tokens")) << inst.err;
  // Without the model next to it, the binary says where it looked.
  fs::remove_all(moved / "share");
  RunResult lost = cm::test::run_program({(moved / "bin" / "clawmine").string(), "tokenize", "-p", "x"});
  EXPECT_EQ(lost.code, 1);
  EXPECT_TRUE(has(lost.err, "the default model is not installed next to")) << lost.err;
  EXPECT_TRUE(has(lost.err, "give -m DIR")) << lost.err;
  fs::remove_all(moved);
}
