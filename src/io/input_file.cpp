// Bounded, type-checked file reads and depth-limited JSON parsing; see input_file.h.
#include "io/input_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>

#include "common/error.h"

namespace cm {

using json = nlohmann::json;

std::string truncate_text(std::string_view s, size_t n) {
  if (s.size() <= n) return std::string(s);
  return std::string(s.substr(0, n)) + "...";
}

std::string read_regular_file(const std::string& path, size_t max_bytes, const std::string& what) {
  const std::string name = what.empty() ? path : what + ": " + path;
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) fail("{}: cannot open: {}", name, std::strerror(errno));
  if (S_ISDIR(st.st_mode)) fail("{}: is a directory, not a file", name);
  if (!S_ISREG(st.st_mode)) fail("{}: is not a regular file (a device, FIFO or socket cannot be read as one)", name);
  if (size_t(st.st_size) > max_bytes) fail("{}: {} bytes is over the {}-byte limit for this file", name, st.st_size, max_bytes);
  // O_NONBLOCK: should the path have become a FIFO since the stat, opening it must not wait for a writer.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) fail("{}: cannot open: {}", name, std::strerror(errno));
  std::string out;
  try {
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) fail("{}: is not a regular file", name);
    out.resize(size_t(st.st_size));
    size_t got = 0;
    for (;;) {
      if (got == out.size()) {
        if (out.size() >= max_bytes + 1) break;
        out.resize(std::min(max_bytes + 1, out.size() + 65536));  // the file may have grown
      }
      ssize_t r = ::read(fd, out.data() + got, out.size() - got);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) fail("{}: read failed: {}", name, std::strerror(errno));
      if (r == 0) break;
      got += size_t(r);
    }
    if (got > max_bytes) fail("{}: over the {}-byte limit for this file", name, max_bytes);
    out.resize(got);
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  return out;
}

void json_too_deep(const std::string& source, int max_depth) {
  throw JsonTooDeep(fmt::format("{}: JSON nested deeper than {} levels", source, max_depth));
}

void json_invalid(const std::string& source, const char* what) {
  fail("{}: not valid JSON: {}", source, truncate_text(what, 200));
}

json parse_json(std::string_view text, const std::string& source, int max_depth) {
  return parse_json_as<json>(text, source, max_depth);
}

json read_json_file(const std::string& path, size_t max_bytes) {
  return parse_json(read_regular_file(path, max_bytes), path);
}

bool json_int_in(const json& v, int64_t lo, int64_t hi, int64_t* out) {
  int64_t x;
  if (v.is_number_unsigned()) {
    if (v.get<uint64_t>() > uint64_t(INT64_MAX)) return false;
    x = int64_t(v.get<uint64_t>());
  } else if (v.is_number_integer()) {
    x = v.get<int64_t>();
  } else {
    return false;
  }
  if (x < lo || x > hi) return false;
  *out = x;
  return true;
}

const char* json_type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::string: return "a string";
    case json::value_t::object: return "an object";
    case json::value_t::array: return "an array";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: return "an integer";
    case json::value_t::number_float: return "a number";
    default: return "a binary value";
  }
}

std::string describe_json(const json& v) {
  if (v.is_string()) return "the string \"" + truncate_text(v.get_ref<const std::string&>(), 40) + "\"";
  if (v.is_number_integer()) return "the integer " + v.dump();
  if (v.is_number()) return "the number " + v.dump();
  if (v.is_boolean()) return v.get<bool>() ? "true" : "false";
  return json_type_name(v);
}

}  // namespace cm
