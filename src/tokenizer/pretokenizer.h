// Pre-tokenization of Hugging Face tokenizer.json files: a `Sequence` of `Split` steps
// (Regex or String pattern, every `behavior`, `invert`) optionally ending in `ByteLevel`
// (`add_prefix_space`, `use_regex` with the GPT-2 pattern). Regexes are compiled with PCRE2
// (PCRE2_UTF | PCRE2_UCP, JIT when available); tokenizer.json patterns are written for
// Oniguruma, whose syntax for the features used here (\p{..} classes, lookahead, {m,n})
// PCRE2 shares.
//
// Input to run() must be valid UTF-8 (the tokenizer splits invalid bytes off first).
#pragma once
#include <nlohmann/json_fwd.hpp>

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace cm::tok {

// A compiled PCRE2 pattern. Thread-safe: match state lives in thread-local scratch.
class Regex {
 public:
  explicit Regex(const std::string& pattern);  // cm::Error naming the pattern if it won't compile
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  // Every match in `s` as (begin, end) byte offsets, iterated like Oniguruma/Rust find_iter:
  // non-overlapping, left to right, and an empty match right where the previous match ended is
  // skipped by advancing one character.
  void find_all(std::string_view s, std::vector<std::pair<size_t, size_t>>& out) const;
  // True when the pattern matches starting exactly at byte offset `at` of `s`.
  bool matches_at(std::string_view s, size_t at) const;

 private:
  bool search(std::string_view s, size_t from, uint32_t options, size_t& b, size_t& e) const;
  void* code_ = nullptr;  // pcre2_code_8*
  bool jit_ = false;
};

// "Word" characters, written as the inside of a PCRE2 character class (checked code point by
// code point against `tokenizers`; PCRE2 10.42's own UCP \w is Letter|Number|'_'):
// Oniguruma's \w, used by tokenizer.json Split regexes: Alphabetic, marks, decimal digits,
// connector punctuation, plus the Latin-1 digits/fractions ² ³ ¹ ¼ ½ ¾ of its 8-bit table.
inline constexpr const char* kOnigWordClass = R"(\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\x{B2}\x{B3}\x{B9}\x{BC}-\x{BE})";
// Inside a bracket expression ([\w.]) Oniguruma leaves the Latin-1 extras out.
inline constexpr const char* kOnigWordClassInSet = R"(\p{Alphabetic}\p{M}\p{Nd}\p{Pc})";
// Rust regex's \w, used by HF for added tokens' single_word: the same without the Latin-1 extras,
// plus the joiners ZWNJ/ZWJ.
inline constexpr const char* kRustWordClass = R"(\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\x{200C}\x{200D})";

// Oniguruma's \s: Unicode White_Space (PCRE2 10.42 also counts U+180E).
inline constexpr const char* kOnigSpaceClass =
    R"(\t\n\x{0B}\f\r \x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";

// Oniguruma pattern -> equivalent PCRE2 pattern (rewrites \w \W \b \B \s \S). Exposed for tests.
std::string onig_to_pcre2(const std::string& pattern);

enum class SplitBehavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

class PreTokenizer {
 public:
  // `j` is the tokenizer.json "pre_tokenizer" value (null = the whole text is one piece).
  static PreTokenizer from_json(const nlohmann::json& j);
  PreTokenizer();
  ~PreTokenizer();
  PreTokenizer(PreTokenizer&&) noexcept;
  PreTokenizer& operator=(PreTokenizer&&) noexcept;

  // Calls emit(piece) for every non-empty pre-token of `text`, left to right. With ByteLevel
  // the pieces are still raw bytes (the byte->char mapping happens in the BPE model), but any
  // prefix space has been added.
  void run(std::string_view text, const std::function<void(std::string_view)>& emit) const;
  bool byte_level() const { return byte_level_; }

 private:
  struct Step {
    std::unique_ptr<Regex> re;
    SplitBehavior behavior = SplitBehavior::Isolated;
    bool invert = false;
  };
  void add_from_json(const nlohmann::json& j, bool last);
  void apply(size_t step, std::string_view piece, const std::function<void(std::string_view)>& emit,
             std::vector<std::vector<std::pair<size_t, size_t>>>& scratch) const;
  void final_step(std::string_view piece, const std::function<void(std::string_view)>& emit,
                  std::vector<std::pair<size_t, size_t>>& scratch) const;

  std::vector<Step> steps_;
  bool byte_level_ = false, add_prefix_space_ = false;
  std::unique_ptr<Regex> gpt2_;  // ByteLevel use_regex
};

// Splits `s` by the matches of `re` and applies `behavior`/`invert` exactly like HF
// NormalizedString::split; returns non-empty (begin, end) ranges. Exposed for tests.
void split_ranges(const Regex& re, SplitBehavior behavior, bool invert, std::string_view s,
                  std::vector<std::pair<size_t, size_t>>& out);

}  // namespace cm::tok
