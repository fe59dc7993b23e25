// Writing an output file so that nothing is damaged and nothing is left
// half-written.
//
// A regular (or not yet existing) target is written to a fresh temporary file
// next to it and renamed over it only when every write and the close have
// succeeded; on any failure the temporary is removed and the old file stays.
// A target that is not a regular file is never replaced: character devices
// (/dev/null, a terminal) and FIFOs are opened and written directly, as a
// shell redirection would; block devices, sockets and directories are refused.
// A symlink is written through: the file it finally points to is the target
// (replacing the link itself with a regular file would silently cut it), so
// the link survives and its target gets the data. Paths inside a protected
// directory (the model being read) are refused, and so is any target that is
// the same file (a hard link) as one of that directory's files.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace cm {

class OutputFile {
 public:
  // Decides how `path` is written and opens it; throws cm::Error naming the path.
  explicit OutputFile(const std::string& path, const std::vector<std::string>& protect_dirs = {});
  ~OutputFile();  // without commit(): closes and removes the temporary
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  void write(const void* data, size_t n);  // throws on any short or failed write
  void write(std::string_view s) { write(s.data(), s.size()); }
  void commit();                           // close (checked), then rename into place

  bool direct() const { return direct_; }  // writing a device or FIFO in place

 private:
  void abandon() noexcept;
  std::string path_;    // as given (for messages)
  std::string target_;  // after following symlinks
  std::string tmp_;     // temporary name, empty when direct
  int fd_ = -1;
  bool direct_ = false;
};

// Checks that `path` could be written as above (same refusals as OutputFile)
// without creating anything, so a command can fail before a long computation.
void check_output_path(const std::string& path, const std::vector<std::string>& protect_dirs = {});

// Writes `data` to `path` through an OutputFile.
void write_output_file(const std::string& path, std::string_view data,
                       const std::vector<std::string>& protect_dirs = {});

}  // namespace cm
