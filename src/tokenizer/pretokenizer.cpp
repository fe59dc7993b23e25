// Pre-tokenizer implementation; semantics documented in pretokenizer.h.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/pretokenizer.h"

#include <pcre2.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>

#include "common/error.h"
#include "io/input_file.h"
#include "tokenizer/utf8.h"

namespace cm::tok {

namespace {
// GPT-2's pre-tokenization pattern, used by ByteLevel when use_regex is true.
const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// One match-data block per thread, shared by all patterns (only the whole-match offsets are read).
pcre2_match_data* scratch_match_data() {
  struct Holder {
    pcre2_match_data* md = pcre2_match_data_create(1, nullptr);
    ~Holder() { pcre2_match_data_free(md); }
  };
  thread_local Holder h;
  return h.md;
}

// A String pattern is matched literally: escape everything that is not alphanumeric ASCII.
std::string escape_literal(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (c < 0x80 && !std::isalnum(c)) out += '\\';
    out += static_cast<char>(c);
  }
  return out;
}

SplitBehavior behavior_of(const std::string& s) {
  if (s == "Removed") return SplitBehavior::Removed;
  if (s == "Isolated") return SplitBehavior::Isolated;
  if (s == "MergedWithPrevious") return SplitBehavior::MergedWithPrevious;
  if (s == "MergedWithNext") return SplitBehavior::MergedWithNext;
  if (s == "Contiguous") return SplitBehavior::Contiguous;
  fail("tokenizer.json: unknown Split behavior '{}'", s);
}
}  // namespace

// tokenizer.json regexes are Oniguruma patterns. PCRE2 agrees on everything these files use
// except the word class (see kOnigWordClass) and U+180E in \s, so \w, \W, \b, \B, \s and \S are
// rewritten to explicit classes; POSIX bracket classes, whose Oniguruma sets differ too, are rejected. Remaining
// difference: characters assigned after PCRE2's Unicode version (10.42: Unicode 14) have no
// properties here.
std::string onig_to_pcre2(const std::string& pat) {
  const std::string w = kOnigWordClass;
  const std::string word = "[" + w + "]";
  std::string out;
  int depth = 0;  // character-class nesting
  for (size_t i = 0; i < pat.size(); ++i) {
    char c = pat[i];
    if (c == '\\' && i + 1 < pat.size()) {
      char e = pat[++i];
      if (e == 'w') out += depth ? kOnigWordClassInSet : word;
      else if (e == 'W' && !depth) out += "[^" + w + "]";
      else if (e == 'W') fail("tokenizer: \\W inside a character class is not supported in '{}'", pat);
      else if (e == 'b' && !depth) out += "(?:(?<=" + word + ")(?!" + word + ")|(?<!" + word + ")(?=" + word + "))";
      else if (e == 's') out += depth ? std::string(kOnigSpaceClass) : "[" + std::string(kOnigSpaceClass) + "]";
      else if (e == 'S' && !depth) out += "[^" + std::string(kOnigSpaceClass) + "]";
      else if (e == 'S') fail("tokenizer: \\S inside a character class is not supported in '{}'", pat);
      else if (e == 'B' && !depth) out += "(?:(?<=" + word + ")(?=" + word + ")|(?<!" + word + ")(?!" + word + "))";
      else out += c, out += e;
      continue;
    }
    if (c == '[') {
      // Oniguruma's POSIX classes ([:alpha:], [:punct:], ...) mean different sets than PCRE2's.
      CM_CHECK(!(depth && i + 1 < pat.size() && pat[i + 1] == ':'),
               "tokenizer: POSIX character classes like [:alpha:] are not supported in regex '{}'", pat);
      ++depth;
      out += c;
      // A ']' right after '[' or '[^' is a literal member.
      if (i + 1 < pat.size() && pat[i + 1] == '^') out += pat[++i];
      if (i + 1 < pat.size() && pat[i + 1] == ']') out += pat[++i];
      continue;
    }
    if (c == ']' && depth) --depth;
    out += c;
  }
  return out;
}

Regex::Regex(const std::string& pattern) {
  int err = 0;
  PCRE2_SIZE off = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP, &err, &off, nullptr);
  if (!code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    fail("tokenizer: regex '{}' does not compile at offset {}: {}", pattern, off,
         reinterpret_cast<const char*>(msg));
  }
  code_ = code;
  jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

bool Regex::search(std::string_view s, size_t from, uint32_t options, size_t& b, size_t& e) const {
  auto* code = static_cast<pcre2_code*>(code_);
  pcre2_match_data* md = scratch_match_data();
  // The subject was validated by the caller, so skip PCRE2's own UTF check (it is O(n) per call).
  options |= PCRE2_NO_UTF_CHECK;
  int rc = jit_ && !(options & PCRE2_ANCHORED)
               ? pcre2_jit_match(code, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), from,
                                 options, md, nullptr)
               : pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), from, options,
                             md, nullptr);
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(rc, msg, sizeof msg);
    fail("tokenizer: regex match failed: {}", reinterpret_cast<const char*>(msg));
  }
  PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
  b = ov[0];
  e = ov[1];
  return true;
}

void Regex::find_all(std::string_view s, std::vector<std::pair<size_t, size_t>>& out) const {
  out.clear();
  size_t pos = 0;
  size_t last_end = SIZE_MAX;
  while (pos <= s.size()) {
    size_t b, e;
    if (!search(s, pos, 0, b, e)) break;
    if (b == e && e == last_end) {
      // Empty match glued to the previous one: step over one character and search again.
      if (e >= s.size()) break;
      size_t n = utf8::valid_seq_len(s, e);
      pos = e + (n ? n : 1);
      continue;
    }
    out.emplace_back(b, e);
    last_end = e;
    pos = e;
  }
}

bool Regex::matches_at(std::string_view s, size_t at) const {
  size_t b, e;
  return search(s, at, PCRE2_ANCHORED, b, e);
}

void split_ranges(const Regex& re, SplitBehavior behavior, bool invert, std::string_view s,
                  std::vector<std::pair<size_t, size_t>>& out) {
  struct Part {
    size_t b, e;
    bool match;
  };
  thread_local std::vector<std::pair<size_t, size_t>> matches;
  thread_local std::vector<Part> parts;
  re.find_all(s, matches);
  // The pieces between and at the matches, as HF's Pattern::find_matches lists them.
  parts.clear();
  size_t prev = 0;
  for (auto [b, e] : matches) {
    if (prev != b) parts.push_back({prev, b, false});
    parts.push_back({b, e, true});
    prev = e;
  }
  if (prev != s.size()) parts.push_back({prev, s.size(), false});
  if (s.empty()) parts.push_back({0, 0, false});
  if (invert)
    for (Part& p : parts) p.match = !p.match;

  out.clear();
  thread_local std::vector<Part> acc;
  acc.clear();
  bool prev_match = false;
  switch (behavior) {
    case SplitBehavior::Isolated:
      for (const Part& p : parts) acc.push_back(p);
      break;
    case SplitBehavior::Removed:
      for (const Part& p : parts)
        if (!p.match) acc.push_back(p);
      break;
    case SplitBehavior::MergedWithPrevious:
      for (const Part& p : parts) {
        if (p.match && !prev_match && !acc.empty()) acc.back().e = p.e;
        else acc.push_back(p);
        prev_match = p.match;
      }
      break;
    case SplitBehavior::MergedWithNext:
      for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
        if (it->match && !prev_match && !acc.empty()) acc.back().b = it->b;
        else acc.push_back(*it);
        prev_match = it->match;
      }
      std::reverse(acc.begin(), acc.end());
      break;
    case SplitBehavior::Contiguous:
      for (const Part& p : parts) {
        if (p.match == prev_match && !acc.empty()) acc.back().e = p.e;
        else acc.push_back(p);
        prev_match = p.match;
      }
      break;
  }
  for (const Part& p : acc)
    if (p.e > p.b) out.emplace_back(p.b, p.e);
}

PreTokenizer::PreTokenizer() = default;
PreTokenizer::~PreTokenizer() = default;
PreTokenizer::PreTokenizer(PreTokenizer&&) noexcept = default;
PreTokenizer& PreTokenizer::operator=(PreTokenizer&&) noexcept = default;

void PreTokenizer::add_from_json(const nlohmann::json& j, bool last) {
  CM_CHECK(j.is_object() && j.contains("type"), "tokenizer.json: pre_tokenizer entry without a type");
  const std::string type = j["type"].get<std::string>();
  if (type == "Split") {
    CM_CHECK(!byte_level_, "tokenizer.json: a Split pre-tokenizer after ByteLevel is not supported");
    const auto& pat = j.at("pattern");
    Step st;
    if (pat.contains("Regex")) st.re = std::make_unique<Regex>(onig_to_pcre2(pat["Regex"].get<std::string>()));
    else if (pat.contains("String")) st.re = std::make_unique<Regex>(escape_literal(pat["String"].get<std::string>()));
    else fail("tokenizer.json: Split pattern must be {{\"Regex\": ..}} or {{\"String\": ..}}");
    st.behavior = behavior_of(j.value("behavior", std::string("Isolated")));
    st.invert = j.value("invert", false);
    steps_.push_back(std::move(st));
  } else if (type == "ByteLevel") {
    CM_CHECK(last, "tokenizer.json: ByteLevel must be the last pre-tokenizer of the Sequence");
    byte_level_ = true;
    add_prefix_space_ = j.value("add_prefix_space", false);
    if (j.value("use_regex", true)) gpt2_ = std::make_unique<Regex>(onig_to_pcre2(kGpt2Pattern));
  } else if (type == "Sequence") {
    const auto& list = j.at("pretokenizers");
    for (size_t i = 0; i < list.size(); ++i) add_from_json(list[i], last && i + 1 == list.size());
  } else {
    fail("tokenizer.json: pre_tokenizer type '{}' is not supported (Split, ByteLevel, Sequence are)",
         truncate_text(type, 60));
  }
}

PreTokenizer PreTokenizer::from_json(const nlohmann::json& j) {
  PreTokenizer p;
  if (!j.is_null()) p.add_from_json(j, true);
  return p;
}

void PreTokenizer::final_step(std::string_view piece, const std::function<void(std::string_view)>& emit,
                              std::vector<std::pair<size_t, size_t>>& scratch) const {
  std::string prefixed;
  if (add_prefix_space_ && piece[0] != ' ') {
    prefixed.reserve(piece.size() + 1);
    prefixed += ' ';
    prefixed += piece;
    piece = prefixed;
  }
  if (!gpt2_) {
    emit(piece);
    return;
  }
  split_ranges(*gpt2_, SplitBehavior::Isolated, false, piece, scratch);
  for (auto [b, e] : scratch) emit(piece.substr(b, e - b));
}

void PreTokenizer::apply(size_t step, std::string_view piece,
                         const std::function<void(std::string_view)>& emit,
                         std::vector<std::vector<std::pair<size_t, size_t>>>& scratch) const {
  if (piece.empty()) return;
  if (step == steps_.size()) {
    if (byte_level_) final_step(piece, emit, scratch[step]);
    else emit(piece);
    return;
  }
  const Step& st = steps_[step];
  auto& ranges = scratch[step];
  split_ranges(*st.re, st.behavior, st.invert, piece, ranges);
  // Each depth owns its scratch vector, so deeper calls leave `ranges` intact.
  for (size_t i = 0; i < ranges.size(); ++i)
    apply(step + 1, piece.substr(ranges[i].first, ranges[i].second - ranges[i].first), emit, scratch);
}

void PreTokenizer::run(std::string_view text, const std::function<void(std::string_view)>& emit) const {
  std::vector<std::vector<std::pair<size_t, size_t>>> scratch(steps_.size() + 1);
  apply(0, text, emit, scratch);
}

}  // namespace cm::tok
