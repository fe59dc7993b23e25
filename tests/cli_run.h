// Runs a program as a test would from a shell, without a shell: argv as
// given, optional text on stdin (else /dev/null), extra or removed
// environment variables; returns the exit code, stdout, stderr and the
// child's own peak RSS (wait4), so tests can assert on all four.
#pragma once
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace cm::test {

struct RunResult {
  int code = -1;
  std::string out, err;
  long max_rss_kb = 0;
};

struct RunOptions {
  std::string stdin_text;                 // written to a file that becomes stdin
  bool has_stdin = false;                 // false: stdin is an empty file (not a terminal)
  std::vector<std::string> set_env;       // "NAME=value"
  std::vector<std::string> unset_env;     // names
};

inline std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

inline RunResult run_program(const std::vector<std::string>& argv, const RunOptions& o = {}) {
  namespace fs = std::filesystem;
  static int counter = 0;
  const std::string base =
      (fs::temp_directory_path() / ("cm_run_" + std::to_string(::getpid()) + "_" + std::to_string(counter++))).string();
  const std::string in = base + ".in", out = base + ".out", err = base + ".err";
  // An empty file rather than /dev/null: the test does not depend on the device.
  std::ofstream(in, std::ios::binary) << (o.has_stdin ? o.stdin_text : std::string());
  pid_t pid = ::fork();
  if (pid == 0) {
    int fi = ::open(in.c_str(), O_RDONLY);
    int fo = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    int fe = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ::dup2(fi, 0);
    ::dup2(fo, 1);
    ::dup2(fe, 2);
    for (const auto& n : o.unset_env) ::unsetenv(n.c_str());
    for (const auto& kv : o.set_env) ::putenv(const_cast<char*>(kv.c_str()));
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  RunResult r;
  int st = 0;
  struct rusage ru {};
  ::wait4(pid, &st, 0, &ru);
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  r.max_rss_kb = ru.ru_maxrss;
  r.out = slurp(out);
  r.err = slurp(err);
  fs::remove(in);
  fs::remove(out);
  fs::remove(err);
  return r;
}

}  // namespace cm::test
