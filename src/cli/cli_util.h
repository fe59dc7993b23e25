// Small helpers shared by CLI commands: token-list parsing, escapes, reading
// a prompt, and the "did you mean" suggestion for mistyped names.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace cm::cli {

// "5,17,42", "5 17 42" (as `tokenize` prints) or a mix -> {5, 17, 42};
// rejects an empty list, empty items between commas, non-digits and overflow.
// `flag` names the option in errors.
std::vector<int32_t> parse_token_list(const std::string& s, const std::string& flag = "--tokens");

// Token ids from --tokens LIST, --tokens - (stdin) or --tokens-file PATH (PATH "-": stdin), in
// parse_token_list's format (commas, spaces or newlines between ids); exactly one of `list` and `file` is
// non-empty, else an error says how to give them. A file is read as read_regular_file does (bounded size,
// no directories or devices).
std::vector<int32_t> read_token_ids(const std::string& list, const std::string& file);

// llama.cpp's -p escape processing: \n \t \r \a \b \f \v \\ \' \" \? and \xHH;
// an unknown escape is kept as written.
std::string process_escapes(const std::string& s);

// The whole of a file's bytes, or of stdin for "-"; fails naming `flag` and the path.
std::string read_text_file(const std::string& path, const std::string& flag);

// The candidate nearest to `name` (edit distance, or a prefix either way), or
// "" when none is close enough to be a plausible typo.
std::string nearest(const std::string& name, const std::vector<std::string>& candidates);

}  // namespace cm::cli
