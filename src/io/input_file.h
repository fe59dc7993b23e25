// Reading small input files (configs, tokenizer files, text) and JSON safely.
//
// Files: the type is checked before reading, so a directory, a device
// (/dev/zero) or a FIFO given where a file belongs is an error naming it
// rather than an endless read, a hang or an "empty file"; sizes are bounded.
// JSON: nesting deeper than a limit is refused while parsing (deep values
// would crash later through recursion in copying, dumping and destruction),
// and parser messages are cut short so an untrusted value is never printed
// whole. describe_json() gives a short, bounded description of a value for
// error messages ("a string", "the integer 7").
#pragma once
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "common/error.h"

namespace cm {

constexpr int kMaxJsonDepth = 64;

// Thrown by the JSON parsers below for nesting past the limit (a cm::Error).
struct JsonTooDeep : Error {
  using Error::Error;
};
constexpr size_t kMaxConfigBytes = size_t(64) << 20;   // config / generation / tokenizer_config / index JSON
constexpr size_t kMaxTokenizerBytes = size_t(1) << 30; // tokenizer.json
constexpr size_t kMaxTextBytes = size_t(1) << 30;      // text and token files given with -f / --calib

// The bytes of the regular file `path`; throws cm::Error naming `path` (and
// `what`, a flag or role, when given) for a missing file, a directory, a
// device/FIFO/socket, a read error, or a size over max_bytes. Never blocks.
std::string read_regular_file(const std::string& path, size_t max_bytes, const std::string& what = "");

// Parses JSON text; errors start with `source` (a file name). Refuses nesting
// deeper than max_depth.
nlohmann::json parse_json(std::string_view text, const std::string& source, int max_depth = kMaxJsonDepth);

// parse_json for any nlohmann JSON type (e.g. ordered_json).
template <class J>
J parse_json_as(std::string_view text, const std::string& source, int max_depth = kMaxJsonDepth);

// read_regular_file + parse_json.
nlohmann::json read_json_file(const std::string& path, size_t max_bytes = kMaxConfigBytes);

// "a boolean", "a string", "an object", "an array", "a number", "null".
const char* json_type_name(const nlohmann::json& v);
// A bounded description for messages: scalars shown (strings cut to 40
// bytes), containers only named, e.g. "the string \"abc\"", "an object".
std::string describe_json(const nlohmann::json& v);
// True when v is an integer within [lo, hi] (signed or unsigned storage alike); sets *out.
bool json_int_in(const nlohmann::json& v, int64_t lo, int64_t hi, int64_t* out);
// s cut to at most n bytes, with "..." when cut.
std::string truncate_text(std::string_view s, size_t n);

[[noreturn]] void json_too_deep(const std::string& source, int max_depth);
[[noreturn]] void json_invalid(const std::string& source, const char* what);

template <class J>
J parse_json_as(std::string_view text, const std::string& source, int max_depth) {
  // The callback sees each container as it opens, with the number of containers around it.
  typename J::parser_callback_t limit = [&](int depth, typename J::parse_event_t ev, J&) {
    if ((ev == J::parse_event_t::object_start || ev == J::parse_event_t::array_start) && depth >= max_depth)
      json_too_deep(source, max_depth);
    return true;
  };
  try {
    return J::parse(text.begin(), text.end(), limit);
  } catch (const typename J::exception& e) {
    json_invalid(source, e.what());
  }
}

}  // namespace cm
