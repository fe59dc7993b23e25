// Output files: temp + rename for regular files, direct writes for character
// devices and FIFOs, refusals for everything else; see output_file.h.
#include "io/output_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "common/error.h"

namespace cm {

namespace fs = std::filesystem;

namespace {

enum class Mode { REPLACE, DIRECT };

struct Plan {
  std::string target;  // the path finally written (or renamed over)
  Mode mode = Mode::REPLACE;
  bool exists = false;
  mode_t perm = 0666;  // permissions of an existing target, kept by the replacement
};

// Follows symlinks from `path` (relative links resolve against their own
// directory) to the name that is not a link; it may not exist (a dangling link).
std::string follow_links(const std::string& path) {
  fs::path p = path;
  for (int hop = 0; hop < 40; ++hop) {
    struct stat st {};
    if (::lstat(p.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) return p.string();
    std::error_code ec;
    fs::path to = fs::read_symlink(p, ec);
    if (ec) fail("{}: cannot read the symlink: {}", path, ec.message());
    p = to.is_absolute() ? to : p.parent_path() / to;
  }
  fail("{}: too many levels of symbolic links", path);
}

bool inside(const fs::path& dir, const fs::path& p) {
  auto m = std::mismatch(dir.begin(), dir.end(), p.begin(), p.end());
  return m.first == dir.end();
}

// Refuses targets inside a protected directory or hard-linked to one of its files.
void check_protected(const std::string& path, const std::string& target, const struct stat* st,
                     const std::vector<std::string>& protect_dirs) {
  std::error_code ec;
  const fs::path t = fs::weakly_canonical(fs::absolute(target), ec);
  for (const std::string& d : protect_dirs) {
    if (d.empty()) continue;
    std::error_code ec2;
    const fs::path c = fs::weakly_canonical(fs::absolute(d), ec2);
    if (ec2) continue;
    if (!ec && inside(c, t)) fail("{}: refusing to write into the model directory '{}'", path, d);
    if (!st) continue;
    for (const auto& e : fs::directory_iterator(c, ec2)) {
      struct stat s {};
      if (::stat(e.path().c_str(), &s) == 0 && s.st_dev == st->st_dev && s.st_ino == st->st_ino)
        fail("{}: is the same file as the model's '{}'; refusing to overwrite it", path, e.path().string());
    }
  }
}

Plan make_plan(const std::string& path, const std::vector<std::string>& protect_dirs) {
  if (path.empty()) fail("output path is empty");
  Plan p;
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {  // follows symlinks: what a write would reach
    if (S_ISDIR(st.st_mode)) fail("{}: is a directory, not an output file", path);
    if (S_ISBLK(st.st_mode)) fail("{}: is a block device; refusing to write an output file onto it", path);
    if (S_ISSOCK(st.st_mode)) fail("{}: is a socket; cannot write an output file to it", path);
    if (S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode)) {
      p.target = path;
      p.mode = Mode::DIRECT;
      return p;
    }
    if (!S_ISREG(st.st_mode)) fail("{}: is not a regular file", path);
    p.target = follow_links(path);
    p.exists = true;
    p.perm = st.st_mode & 07777;
    check_protected(path, p.target, &st, protect_dirs);
    return p;
  }
  if (errno != ENOENT) fail("{}: cannot stat: {}", path, std::strerror(errno));
  p.target = follow_links(path);  // a dangling symlink: create the file it names
  check_protected(path, p.target, nullptr, protect_dirs);
  fs::path parent = fs::path(p.target).parent_path();
  if (parent.empty()) parent = ".";
  std::error_code ec;
  if (!fs::is_directory(parent, ec)) fail("{}: directory '{}' does not exist", path, parent.string());
  return p;
}

}  // namespace

OutputFile::OutputFile(const std::string& path, const std::vector<std::string>& protect_dirs) : path_(path) {
  Plan p = make_plan(path, protect_dirs);
  target_ = p.target;
  if (p.mode == Mode::DIRECT) {
    direct_ = true;
    fd_ = ::open(path.c_str(), O_WRONLY | O_CLOEXEC | O_NOCTTY);  // a FIFO waits for its reader, as `>` does
    if (fd_ < 0) fail("{}: cannot open for writing: {}", path, std::strerror(errno));
    return;
  }
  for (int n = 0; n < 1000 && fd_ < 0; ++n) {
    tmp_ = target_ + ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(n);
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, p.exists ? 0600 : 0666);
    if (fd_ < 0 && errno != EEXIST) {
      int e = errno;
      tmp_.clear();
      fail("{}: cannot create the output file: {}", path, std::strerror(e));
    }
  }
  if (fd_ < 0) {
    tmp_.clear();
    fail("{}: cannot find a free temporary name next to it", path);
  }
  if (p.exists && ::fchmod(fd_, p.perm) != 0) {
    int e = errno;
    abandon();
    fail("{}: cannot set permissions: {}", path, std::strerror(e));
  }
}

OutputFile::~OutputFile() { abandon(); }

void OutputFile::abandon() noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (!tmp_.empty()) ::unlink(tmp_.c_str());
  tmp_.clear();
}

void OutputFile::write(const void* data, size_t n) {
  if (fd_ < 0) fail("{}: write after the file was closed", path_);
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd_, p, std::min<size_t>(n, size_t(1) << 30));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      int e = w < 0 ? errno : EIO;
      abandon();
      fail("{}: write failed: {}", path_, std::strerror(e));
    }
    p += w;
    n -= size_t(w);
  }
}

void OutputFile::commit() {
  if (fd_ < 0) fail("{}: already closed", path_);
  int rc = ::close(fd_);
  int e = errno;
  fd_ = -1;
  if (rc != 0) {
    abandon();
    fail("{}: closing failed (data may not have been written): {}", path_, std::strerror(e));
  }
  if (direct_) return;
  if (::rename(tmp_.c_str(), target_.c_str()) != 0) {
    e = errno;
    abandon();
    fail("{}: cannot move the finished file into place: {}", path_, std::strerror(e));
  }
  tmp_.clear();
}

void check_output_path(const std::string& path, const std::vector<std::string>& protect_dirs) {
  make_plan(path, protect_dirs);
}

void write_output_file(const std::string& path, std::string_view data, const std::vector<std::string>& protect_dirs) {
  OutputFile f(path, protect_dirs);
  f.write(data);
  f.commit();
}

}  // namespace cm
