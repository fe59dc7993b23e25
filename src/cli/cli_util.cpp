#include "cli/cli_util.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

#include "common/error.h"
#include "io/input_file.h"

namespace cm::cli {

namespace {
// A list as errors show it: whole when short, its start otherwise (a file of 65,536 ids is not echoed).
std::string shown(const std::string& s) { return s.size() <= 80 ? s : s.substr(0, 60) + "... (" + std::to_string(s.size()) + " bytes)"; }
}  // namespace

std::vector<int32_t> parse_token_list(const std::string& s, const std::string& flag) {
  std::vector<int32_t> out;
  auto space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  size_t i = 0;
  bool after_comma = false;
  while (true) {
    while (i < s.size() && space(s[i])) ++i;
    if (i == s.size()) {
      if (after_comma) fail("{}: empty item at the end of '{}'", flag, shown(s));
      break;
    }
    if (s[i] == ',') fail("{}: empty item in '{}'", flag, shown(s));
    size_t j = i;
    while (j < s.size() && s[j] != ',' && !space(s[j])) ++j;
    const std::string item = s.substr(i, j - i);
    int64_t v = 0;
    for (char ch : item) {
      if (ch < '0' || ch > '9') fail("{}: '{}' is not a token id", flag, shown(item));
      v = v * 10 + (ch - '0');
      if (v > INT32_MAX) fail("{}: '{}' is too large", flag, shown(item));
    }
    out.push_back(int32_t(v));
    i = j;
    while (i < s.size() && space(s[i])) ++i;
    after_comma = i < s.size() && s[i] == ',';
    if (after_comma) ++i;
  }
  if (out.empty()) fail("{}: empty token list", flag);
  return out;
}

std::vector<int32_t> read_token_ids(const std::string& list, const std::string& file) {
  if (!list.empty() && !file.empty()) fail("--tokens and --tokens-file: give the ids one way");
  if (list.empty() && file.empty()) fail("no token ids: give --tokens LIST, --tokens - (stdin) or --tokens-file PATH");
  if (!list.empty() && list != "-") return parse_token_list(list, "--tokens");
  const std::string& path = list.empty() ? file : list;
  const std::string flag = list.empty() ? "--tokens-file" : "--tokens";
  const std::string text = path == "-" ? read_text_file("-", flag) : read_regular_file(path, kMaxTextBytes, flag);
  if (text.size() > kMaxTextBytes) fail("{} -: more than {} bytes on stdin", flag, kMaxTextBytes);
  return parse_token_list(text, path == "-" ? flag + " -" : flag + " " + path);
}

std::string process_escapes(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\' || i + 1 == s.size()) {
      out += s[i];
      continue;
    }
    const char c = s[++i];
    switch (c) {
      case 'n': out += '\n'; break;
      case 't': out += '\t'; break;
      case 'r': out += '\r'; break;
      case 'a': out += '\a'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'v': out += '\v'; break;
      case '\\': out += '\\'; break;
      case '\'': out += '\''; break;
      case '"': out += '"'; break;
      case '?': out += '?'; break;
      case 'x': {
        auto hex = [](char h) -> int {
          if (h >= '0' && h <= '9') return h - '0';
          if (h >= 'a' && h <= 'f') return h - 'a' + 10;
          if (h >= 'A' && h <= 'F') return h - 'A' + 10;
          return -1;
        };
        if (i + 2 < s.size() && hex(s[i + 1]) >= 0 && hex(s[i + 2]) >= 0) {
          out += char(hex(s[i + 1]) * 16 + hex(s[i + 2]));
          i += 2;
        } else {
          out += "\\x";
        }
        break;
      }
      default: out += '\\'; out += c;  // unknown escape: kept as written
    }
  }
  return out;
}

std::string read_text_file(const std::string& path, const std::string& flag) {
  std::ostringstream ss;
  if (path == "-") {
    ss << std::cin.rdbuf();
    if (std::cin.bad()) fail("{} -: cannot read stdin", flag);
    return ss.str();
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("{}: cannot read {}", flag, path);
  ss << in.rdbuf();
  if (in.bad()) fail("{}: error reading {}", flag, path);
  return ss.str();
}

namespace {
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}
// Without the leading dashes, so "--temperature" vs "--temp" compares "temperature" with "temp".
std::string bare(const std::string& s) { return s.substr(std::min(s.find_first_not_of('-'), s.size())); }
}  // namespace

std::string nearest(const std::string& name, const std::vector<std::string>& candidates) {
  const std::string n = bare(name);
  std::string best;
  size_t best_d = SIZE_MAX;
  for (const std::string& c : candidates) {
    const std::string b = bare(c);
    if (b.size() < 2 || n.empty()) continue;
    size_t d = edit_distance(n, b);
    // A prefix either way (--temperature / --temp, --thread / --threads) is a strong hint.
    if (n.rfind(b, 0) == 0 || b.rfind(n, 0) == 0) d = std::min<size_t>(d, 1);
    if (d < best_d) best_d = d, best = c;
  }
  const size_t limit = std::max<size_t>(2, n.size() / 3);
  return best_d <= limit ? best : "";
}

}  // namespace cm::cli
