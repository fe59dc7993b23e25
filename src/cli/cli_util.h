// Small helpers shared by CLI commands: token-list parsing, the standard
// model-loading flags.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace cm::cli {

// "5,17,42" -> {5, 17, 42}; rejects empty items, non-digits and overflow.
std::vector<int32_t> parse_token_list(const std::string& s);

}  // namespace cm::cli
