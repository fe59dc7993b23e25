// OutputFile (io/output_file.h): a failure at any step leaves neither a
// temporary nor a truncated file, special files are never replaced.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "io/output_file.h"
#include "io/safetensors.h"
#include "test_util.h"

namespace fs = std::filesystem;
using cm::test::error_of;

namespace {

fs::path scratch(const std::string& tag) {
  auto d = fs::temp_directory_path() / ("cm_out_" + tag + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

int entries(const fs::path& d) {
  int n = 0;
  for (auto it = fs::directory_iterator(d); it != fs::directory_iterator(); ++it) ++n;
  return n;
}

}  // namespace

TEST(OutputFile, ReplacesRegularFileKeepingItsMode) {
  auto d = scratch("mode");
  auto p = d / "x.txt";
  std::ofstream(p) << "old";
  fs::permissions(p, fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read);
  cm::write_output_file(p.string(), "new contents");
  EXPECT_EQ(slurp(p), "new contents");
  EXPECT_EQ(fs::status(p).permissions() & fs::perms::all,
            fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read);
  EXPECT_EQ(entries(d), 1);
}

// A failed rename (the target became a non-empty directory) removes the temporary.
TEST(OutputFile, FailedRenameLeavesNoTemporary) {
  auto d = scratch("rename");
  auto p = d / "out";
  {
    cm::OutputFile f(p.string());
    f.write("data");
    fs::create_directories(p / "sub");
    std::string e = error_of([&] { f.commit(); });
    EXPECT_NE(e.find("cannot move the finished file into place"), std::string::npos) << e;
  }
  EXPECT_EQ(entries(d), 1);  // only the directory
}

// Dropped without commit (an exception mid-way): no temporary, old file intact.
TEST(OutputFile, AbandonedWriteKeepsTheOldFile) {
  auto d = scratch("abandon");
  auto p = d / "out";
  std::ofstream(p) << "old";
  {
    cm::OutputFile f(p.string());
    f.write("partial");
  }
  EXPECT_EQ(slurp(p), "old");
  EXPECT_EQ(entries(d), 1);
}

// A write that fails (file size limit standing in for a full disk) throws,
// leaves no temporary and keeps the old file. Runs in a child so the limit
// cannot touch the test runner's own output.
TEST(OutputFile, FailedWriteLeavesNothingHalfWritten) {
  auto d = scratch("full");
  auto p = d / "w.safetensors";
  std::ofstream(p) << "old";
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::signal(SIGXFSZ, SIG_IGN);
    struct rlimit rl {4096, 4096};
    ::setrlimit(RLIMIT_FSIZE, &rl);
    std::vector<float> big(1 << 16, 1.0f);
    std::string e = error_of([&] { cm::write_safetensors(p.string(), {cm::tensor_f32("t", {1 << 16}, big.data())}); });
    ::_exit(e.find("write failed") != std::string::npos ? 0 : 1);
  }
  int st = 0;
  ::waitpid(pid, &st, 0);
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 0) << "the write error was not reported";
  EXPECT_EQ(slurp(p), "old");
  EXPECT_EQ(entries(d), 1);
}

TEST(OutputFile, RefusesDirectoriesSocketsAndMissingParents) {
  auto d = scratch("refuse");
  EXPECT_NE(error_of([&] { cm::check_output_path(d.string()); }).find("is a directory"), std::string::npos);
  EXPECT_NE(error_of([&] { cm::check_output_path((d / "no" / "x").string()); }).find("does not exist"),
            std::string::npos);
  EXPECT_NE(error_of([&] { cm::check_output_path(""); }).find("empty"), std::string::npos);
  const std::string sock = (d / "s").string();
  int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::strncpy(a.sun_path, sock.c_str(), sizeof a.sun_path - 1);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  EXPECT_NE(error_of([&] { cm::write_output_file(sock, "x"); }).find("is a socket"), std::string::npos);
  ::close(fd);
  struct stat s {};
  ASSERT_EQ(::lstat(sock.c_str(), &s), 0);
  EXPECT_TRUE(S_ISSOCK(s.st_mode));
}
