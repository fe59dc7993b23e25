// `clawmine tokenize` / `clawmine detokenize` end to end: the binary's output equals the library's
// encode of the file's exact bytes, detokenize inverts it, --no-special and --batch-hex work, and
// bad input exits 1 with an "error:" line.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "tokenizer/tokenizer.h"

namespace fs = std::filesystem;

namespace {
const std::string kDir = std::string(CLAWMINE_TEST_DATA) + "/tokenizer";

struct CliResult {
  int rc;
  std::string out;
};
CliResult run(const std::string& args) {
  std::string cmd = std::string(CLAWMINE_BINARY) + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  int status = pclose(p);
  return {WEXITSTATUS(status), out};
}
std::string ids_line(const std::vector<int32_t>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? " " : "") + std::to_string(ids[i]);
  return s + "\n";
}
std::string tmpfile(const std::string& name, const std::string& bytes) {
  fs::path p = fs::temp_directory_path() / ("cm_tokcli_" + std::to_string(::getpid()) + "_" + name);
  std::ofstream(p, std::ios::binary) << bytes;
  return p.string();
}
}  // namespace

TEST(TokenizerCli, TokenizeFileBytesAndDetokenize) {
  cm::Tokenizer tok = cm::Tokenizer::load(kDir);
  std::string text = "line one\r\n<｜User｜>中文 123456 \xff tail  \n";
  std::string f = tmpfile("in.txt", text);
  CliResult r = run("tokenize -m " + kDir + " --file " + f);
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(r.out, ids_line(tok.encode(text)));
  CliResult ns = run("tokenize -m " + kDir + " --file " + f + " --no-special");
  EXPECT_EQ(ns.out, ids_line(tok.encode(text, {.parse_special = false})));
  EXPECT_NE(ns.out, r.out);

  std::string csv;
  for (int32_t id : tok.encode(text)) csv += (csv.empty() ? "" : ",") + std::to_string(id);
  CliResult d = run("detokenize -m " + kDir + " --ids " + csv);
  ASSERT_EQ(d.rc, 0);
  EXPECT_EQ(d.out, text);  // exact bytes, invalid byte included, no newline added

  CliResult p = run("tokenize -m " + kDir + " -p 'Hello world'");
  EXPECT_EQ(p.out, ids_line(tok.encode("Hello world")));
  fs::remove(f);
}

TEST(TokenizerCli, BatchHex) {
  cm::Tokenizer tok = cm::Tokenizer::load(kDir);
  std::string f = tmpfile("batch.hex", "48656c6c6f\n\nff41\n");
  CliResult r = run("tokenize -m " + kDir + " --batch-hex " + f);
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(r.out, ids_line(tok.encode("Hello")) + "\n" + ids_line(tok.encode("\xff" "A")));
  fs::remove(f);
}

TEST(TokenizerCli, ErrorsExitOne) {
  for (const std::string& args :
       {std::string("tokenize -m /nonexistent_cm -p x"), "tokenize -m " + kDir, "tokenize -m " + kDir + " --file /nonexistent_cm",
        "detokenize -m " + kDir + " --ids 1,abc", "detokenize -m " + kDir + " --ids 99999999"}) {
    CliResult r = run(args);
    EXPECT_EQ(r.rc, 1) << args;
    EXPECT_NE(r.out.find("error"), std::string::npos) << args << ": " << r.out;
  }
}
