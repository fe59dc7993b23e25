#include "cli/cli_util.h"

#include "common/error.h"

namespace cm::cli {

std::vector<int32_t> parse_token_list(const std::string& s) {
  std::vector<int32_t> out;
  size_t i = 0;
  if (s.empty()) fail("--tokens: empty token list");
  while (i <= s.size()) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    std::string item = s.substr(i, j - i);
    while (!item.empty() && item.front() == ' ') item.erase(item.begin());
    while (!item.empty() && item.back() == ' ') item.pop_back();
    if (item.empty()) fail("--tokens: empty item in '{}'", s);
    int64_t v = 0;
    for (char ch : item) {
      if (ch < '0' || ch > '9') fail("--tokens: '{}' is not a token id", item);
      v = v * 10 + (ch - '0');
      if (v > INT32_MAX) fail("--tokens: '{}' is too large", item);
    }
    out.push_back(int32_t(v));
    i = j + 1;
  }
  return out;
}

}  // namespace cm::cli
