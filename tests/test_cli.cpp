// The clawmine binary end to end: logits file contents, chunking through the
// CLI, --layer-stats output, and that every error exits 1 with one line on
// stderr (never a signal).
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>
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

// A private scratch directory per test process (never the machine's /dev/null).
std::filesystem::path scratch(const std::string& tag) {
  auto d = std::filesystem::temp_directory_path() / ("cm_cli_" + tag + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

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
  const std::string out = (scratch("stats") / "l.safetensors").string();
  Result r = run("logits -m " + kModel + " --tokens 5,17,42 --layer-stats -o " + out);
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
  const std::string out = (scratch("errors") / "out.safetensors").string();
  const std::string cases[] = {
      "logits -m /nonexistent --tokens 1,2 -o " + out,
      "logits -m MODEL --tokens 1,,2 -o " + out,
      "logits -m MODEL --tokens 1,x -o " + out,
      "logits -m MODEL --tokens 1,999 -o " + out,
      "logits -m MODEL --tokens 1,2 --chunk -3 -o " + out,
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
  EXPECT_FALSE(std::filesystem::exists(out));
  Result r = run("logits -m /nonexistent --tokens 1 -o " + out);
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

// Token ids from a file or stdin (sequences longer than one command-line argument may hold): the same
// logits and the same perplexity as the ids or text given directly; each way of getting them wrong is a
// one-line error.
TEST(Cli, TokenIdsFromAFileOrStdin) {
  const auto d = scratch("tokfile");
  const std::string ids = "5,17,42,9,9,100,3,77,8";
  { std::ofstream(d / "ids.txt") << "5 17\n42,9, 9\n100 3 77\n8\n"; }
  const std::string a = (d / "a.st").string(), b = (d / "b.st").string(), c = (d / "c.st").string();
  Result r1 = run("logits -m " + kModel + " --tokens " + ids + " -o " + a);
  ASSERT_EQ(r1.code, 0) << r1.err;
  Result r2 = run("logits -m " + kModel + " --tokens-file " + (d / "ids.txt").string() + " -o " + b);
  ASSERT_EQ(r2.code, 0) << r2.err;
  Result r3 = run("logits -m " + kModel + " --tokens - -o " + c + " < " + (d / "ids.txt").string());
  ASSERT_EQ(r3.code, 0) << r3.err;
  cm::SafetensorsFile fa(a), fb(b), fc(c);
  ASSERT_EQ(fb.find("logits")->shape_str(), "[9, 128]");
  EXPECT_EQ(std::memcmp(fa.find("logits")->data, fb.find("logits")->data, 9 * 128 * 4), 0);
  EXPECT_EQ(std::memcmp(fa.find("logits")->data, fc.find("logits")->data, 9 * 128 * 4), 0);

  // perplexity over the text's token ids (as `tokenize` prints them) equals perplexity over the text
  const std::string dir = std::string(CLAWMINE_TEST_DATA) + "/golden/hf_text";
  Result t = run("tokenize -m " + dir + " -f " + dir + "/text.txt");
  ASSERT_EQ(t.code, 0) << t.err;
  { std::ofstream(d / "text_ids.txt") << t.out; }
  Result p1 = run("perplexity -m " + dir + " -f " + dir + "/text.txt --ctx 32");
  Result p2 = run("perplexity -m " + dir + " --tokens-file " + (d / "text_ids.txt").string() + " --ctx 32");
  Result p3 = run("perplexity -m " + dir + " --tokens - --ctx 32 < " + (d / "text_ids.txt").string());
  ASSERT_EQ(p1.code, 0) << p1.err;
  ASSERT_EQ(p2.code, 0) << p2.err;
  ASSERT_EQ(p3.code, 0) << p3.err;
  EXPECT_EQ(p2.out, p1.out);
  EXPECT_EQ(p3.out, p1.out);

  { std::ofstream(d / "bad.txt") << "5,17,x"; }
  { std::ofstream(d / "big.txt") << "5,17,100000"; }
  const std::string out = (d / "never.st").string();
  for (const std::string& args : {
           "logits -m " + kModel + " -o " + out,                                                    // no ids
           "logits -m " + kModel + " --tokens 1 --tokens-file " + (d / "ids.txt").string() + " -o " + out,  // both
           "logits -m " + kModel + " --tokens-file " + (d / "missing.txt").string() + " -o " + out,
           "logits -m " + kModel + " --tokens-file " + d.string() + " -o " + out,                   // a directory
           "logits -m " + kModel + " --tokens-file " + (d / "bad.txt").string() + " -o " + out,
           "logits -m " + kModel + " --tokens-file " + (d / "big.txt").string() + " -o " + out,     // >= vocab
           "logits -m " + kModel + " --tokens - -o " + out + " < /dev/null",                        // empty stdin
           "perplexity -m " + dir + " -f " + dir + "/text.txt --tokens 1,2 --ctx 32",             // two sources
           "perplexity -m " + dir + " --ctx 32",                                                   // none
           "perplexity -m " + dir + " --tokens 5,17,100000 --ctx 2",                               // >= vocab
       }) {
    Result r = run(args);
    EXPECT_EQ(r.code, 1) << args << "\n" << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << args << "\n" << r.err;
    EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << args << "\n" << r.err;
  }
  EXPECT_FALSE(std::filesystem::exists(out));
}

// -o naming a character device writes to it and leaves it a device (it used to
// be renamed over: as root, `-o /dev/null` replaced the machine's /dev/null).
// A private node with /dev/null's numbers stands in for it.
TEST(Cli, OutputToCharDeviceKeepsTheDevice) {
  const auto d = scratch("chardev");
  const std::string node = (d / "null").string();
  if (::mknod(node.c_str(), S_IFCHR | 0666, makedev(1, 3)) != 0)
    GTEST_SKIP() << "mknod not permitted here: " << std::strerror(errno);
  Result r = run("logits -m " + kModel + " --tokens 5,17 -o " + node);
  EXPECT_EQ(r.code, 0) << r.err;
  struct stat st {};
  ASSERT_EQ(::lstat(node.c_str(), &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode)) << "the device was replaced";
  EXPECT_EQ(major(st.st_rdev), 1u);
  EXPECT_EQ(minor(st.st_rdev), 3u);
  for (const auto& e : std::filesystem::directory_iterator(d)) EXPECT_EQ(e.path().filename(), "null");
}

// A FIFO is written in place (its reader gets a whole safetensors file) and stays a FIFO.
TEST(Cli, OutputToFifoStreamsIntoIt) {
  const auto d = scratch("fifo");
  const std::string fifo = (d / "pipe").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  std::string got;
  std::thread reader([&] {
    int fd = ::open(fifo.c_str(), O_RDONLY);
    char buf[4096];
    ssize_t n;
    while (fd >= 0 && (n = ::read(fd, buf, sizeof buf)) > 0) got.append(buf, size_t(n));
    if (fd >= 0) ::close(fd);
  });
  Result r = run("logits -m " + kModel + " --tokens 5,17 -o " + fifo);
  int unblock = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);  // releases the reader if nothing was written
  if (unblock >= 0) ::close(unblock);
  reader.join();
  EXPECT_EQ(r.code, 0) << r.err;
  struct stat st {};
  ASSERT_EQ(::lstat(fifo.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
  const std::string copy = (d / "copy.safetensors").string();
  std::ofstream(copy, std::ios::binary) << got;
  cm::SafetensorsFile f(copy);
  ASSERT_TRUE(f.find("logits"));
  EXPECT_EQ(f.find("logits")->shape_str(), "[2, 128]");
}

// A symlink is written through: the link stays, its target gets the file.
TEST(Cli, OutputThroughSymlinkKeepsTheLink) {
  const auto d = scratch("symlink");
  const auto target = d / "real.safetensors", link = d / "link.safetensors";
  std::ofstream(target) << "old";
  std::filesystem::create_symlink("real.safetensors", link);
  Result r = run("logits -m " + kModel + " --tokens 5,17 -o " + link.string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(std::filesystem::is_symlink(link));
  cm::SafetensorsFile f(target.string());
  EXPECT_EQ(f.find("logits")->shape_str(), "[2, 128]");
  // A dangling link creates the file it names.
  const auto dangling = d / "dangling.safetensors";
  std::filesystem::create_symlink("new.safetensors", dangling);
  r = run("logits -m " + kModel + " --tokens 5 -o " + dangling.string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(std::filesystem::is_symlink(dangling));
  EXPECT_TRUE(std::filesystem::is_regular_file(d / "new.safetensors"));
}

// -o never writes into the model being read, nor onto a hard link of its files.
TEST(Cli, OutputNeverOverwritesTheModel) {
  const auto d = scratch("model");
  const auto model = d / "m";
  std::filesystem::copy(kModel, model);
  const auto weights = model / "model.safetensors";
  const auto size = std::filesystem::file_size(weights);
  for (const std::string& out : {weights.string(), (model / "new.safetensors").string(),
                                 (model / "." / "config.json").string()}) {
    Result r = run("logits -m " + model.string() + " --tokens 5 -o " + out);
    EXPECT_EQ(r.code, 1) << out;
    EXPECT_NE(r.err.find("model directory"), std::string::npos) << r.err;
  }
  std::filesystem::create_hard_link(weights, d / "hard.safetensors");
  Result r = run("logits -m " + model.string() + " --tokens 5 -o " + (d / "hard.safetensors").string());
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("same file as the model's"), std::string::npos) << r.err;
  EXPECT_EQ(std::filesystem::file_size(weights), size);
  EXPECT_FALSE(std::filesystem::exists(model / "new.safetensors"));
}

// A full disk (/dev/full answers every write with ENOSPC) is an error, not exit 0.
TEST(Cli, OutputWriteFailureExitsOne) {
  if (!std::filesystem::is_character_file("/dev/full")) GTEST_SKIP() << "no /dev/full";
  Result r = run("logits -m " + kModel + " --tokens 5,17 -o /dev/full");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("/dev/full: write failed"), std::string::npos) << r.err;
  const auto d = scratch("dir");
  r = run("logits -m " + kModel + " --tokens 5 -o " + d.string());
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("is a directory"), std::string::npos) << r.err;
}

// Perplexity's window flags: zero or negative values are errors, not "use the default".
TEST(Cli, PerplexityRejectsNonPositiveFlags) {
  const std::string dir = std::string(CLAWMINE_TEST_DATA) + "/golden/hf_text";
  const std::string base = "perplexity -m " + dir + " -f " + dir + "/text.txt ";
  const std::pair<const char*, const char*> cases[] = {
      {"--ctx 0", "--ctx must be >= 2 (got 0)"},       {"--ctx -5", "--ctx must be >= 2 (got -5)"},
      {"--stride 0", "--stride must be >= 1 (got 0)"}, {"--stride -1", "--stride must be >= 1 (got -1)"},
      {"--chunks 0", "--chunks must be >= 1 (got 0)"}, {"--chunks -1", "--chunks must be >= 1 (got -1)"},
  };
  for (const auto& [flag, msg] : cases) {
    const bool ctx = std::string(flag).rfind("--ctx", 0) == 0;
    Result r = run(base + (ctx ? "" : "--ctx 32 ") + flag);
    EXPECT_EQ(r.code, 1) << flag;
    EXPECT_NE(r.err.find(msg), std::string::npos) << flag << "\n" << r.err;
  }
  Result ok = run(base + "--ctx 32 --chunks 1");
  EXPECT_EQ(ok.code, 0) << ok.err;
  EXPECT_NE(ok.out.find("1 windows"), std::string::npos) << ok.out;
}

// Files given with -f are checked before reading: /dev/zero, FIFOs and
// directories are errors (they used to read forever, block, or read as empty).
TEST(Cli, InputFilesMustBeRegular) {
  const auto d = scratch("inputs");
  const std::string fifo = (d / "fifo").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string dir = std::string(CLAWMINE_TEST_DATA) + "/golden/hf_text";
  for (const std::string& cmd : {"perplexity -m " + dir + " -f ", "tokenize -m " + dir + " -f "}) {
    Result z = run(cmd + "/dev/zero");
    EXPECT_EQ(z.code, 1) << cmd;
    EXPECT_NE(z.err.find("--file: /dev/zero: is not a regular file"), std::string::npos) << z.err;
    Result f = run(cmd + fifo);
    EXPECT_EQ(f.code, 1) << cmd;
    EXPECT_NE(f.err.find("is not a regular file"), std::string::npos) << f.err;
    Result g = run(cmd + d.string());
    EXPECT_EQ(g.code, 1) << cmd;
    EXPECT_NE(g.err.find("is a directory"), std::string::npos) << g.err;
  }
}

// --gpu-memory-utilization on every command that takes --device: accepted in (0, 1] (a CPU run
// ignores it), anything else is a usage error naming the flag and the range; the environment
// mirror is checked the same way.
// --enforce-eager (CUDA graphs off) and --fast-prefill (CUDA: cuBLAS for long prefill steps) are
// flags of every command that runs the model; on the CPU they change nothing, so the logits are
// those of a run without them.
TEST(Cli, EnforceEagerIsAcceptedAndChangesNoResult) {
  const std::string a = (scratch("eager") / "a.safetensors").string(), b = (scratch("eager") / "b.safetensors").string();
  const std::string c = (scratch("eager") / "c.safetensors").string();
  Result fast = run("logits -m " + kModel + " --tokens 5,17 --device cpu --fast-prefill -o " + c);
  EXPECT_EQ(fast.code, 0) << fast.err;
  Result with = run("logits -m " + kModel + " --tokens 5,17 --device cpu --enforce-eager -o " + a);
  EXPECT_EQ(with.code, 0) << with.err;
  Result without = run("logits -m " + kModel + " --tokens 5,17 --device cpu -o " + b);
  EXPECT_EQ(without.code, 0) << without.err;
  const auto bytes = [](const std::string& f) {
    std::ifstream in(f, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  EXPECT_FALSE(bytes(a).empty());
  EXPECT_EQ(bytes(a), bytes(b));
  EXPECT_EQ(bytes(c), bytes(b));
  Result gen = run("generate -m " + kModel + " --tokens 5 -n 1 --device cpu --enforce-eager --fast-prefill");
  EXPECT_EQ(gen.code, 0) << gen.err;
  Result bad = run("logits -m " + kModel + " --tokens 5,17 --device cpu --enforce-eager=maybe -o " + a);
  EXPECT_EQ(bad.code, 1) << bad.err;
}

TEST(Cli, GpuMemoryUtilizationIsAcceptedAndRangeChecked) {
  const std::string out = (scratch("gmu") / "l.safetensors").string();
  Result ok = run("logits -m " + kModel + " --tokens 5,17 --device cpu --gpu-memory-utilization 0.5 -o " + out);
  EXPECT_EQ(ok.code, 0) << ok.err;
  Result one = run("logits -m " + kModel + " --tokens 5,17 --device cpu --gpu-memory-utilization 1 -o " + out);
  EXPECT_EQ(one.code, 0) << one.err;
  for (const char* cmd : {"logits --tokens 5,17 -o ", "generate --tokens 5 -n 1", "chat", "perplexity -f MODEL/config.json",
                          "serve"}) {
    for (const char* bad : {"0", "1.5", "-0.1", "nan", "x"}) {
      std::string c = std::string(cmd) + (std::string(cmd).find("-o ") != std::string::npos ? out : std::string());
      if (size_t at = c.find("MODEL"); at != std::string::npos) c.replace(at, 5, kModel);
      Result r = run(c + " -m " + kModel + " --device cpu --gpu-memory-utilization " + bad);
      EXPECT_EQ(r.code, 1) << c << " " << bad << "\n" << r.err;
      EXPECT_NE(r.err.find("--gpu-memory-utilization"), std::string::npos) << c << " " << bad << "\n" << r.err;
      EXPECT_NE(r.err.find("(0, 1]"), std::string::npos) << c << " " << bad << "\n" << r.err;
    }
  }
  ::setenv("CLAWMINE_GPU_MEMORY_UTILIZATION", "2", 1);
  Result env = run("logits -m " + kModel + " --tokens 5,17 --device cpu -o " + out);
  ::unsetenv("CLAWMINE_GPU_MEMORY_UTILIZATION");
  EXPECT_EQ(env.code, 1) << env.err;
  EXPECT_NE(env.err.find("(0, 1]"), std::string::npos) << env.err;
}
