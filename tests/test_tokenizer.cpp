// Tokenizer against Hugging Face `tokenizers`: tests/data/tokenizer/cases.json holds the ids the
// Python library produced (tools/make_tokenizer_fixtures.py) for a few hundred tricky strings on a
// tokenizer.json with DeepSeek-V3/V4's pre-tokenizer; every one must match exactly. Also: round
// trips, the streaming decoder, invalid UTF-8, load errors, and an encode-speed measurement.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/error.h"
#include "test_util.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

using namespace cm;
namespace fs = std::filesystem;

namespace {
const std::string kDir = std::string(CLAWMINE_TEST_DATA) + "/tokenizer";

const Tokenizer& fixture_tok() {
  static Tokenizer t = Tokenizer::load(kDir);
  return t;
}
std::string slurp(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}
std::string unhex(const std::string& h) {
  std::string out;
  for (size_t i = 0; i + 1 < h.size(); i += 2) out += static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16));
  return out;
}
struct Case {
  std::string bytes;
  std::vector<int32_t> ids, ids_no_special;
};
std::vector<Case> cases() {
  auto j = nlohmann::json::parse(slurp(kDir + "/cases.json"));
  std::vector<Case> out;
  for (const auto& c : j)
    out.push_back({unhex(c["hex"]), c["ids"].get<std::vector<int32_t>>(),
                   c["ids_no_special"].get<std::vector<int32_t>>()});
  return out;
}
bool valid_utf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    size_t n = utf8::valid_seq_len(s, i);
    if (!n) return false;
    i += n;
  }
  return true;
}
std::string show(const std::string& s) {
  std::string o;
  for (unsigned char c : s) o += (c >= 0x20 && c < 0x7f) ? std::string(1, c) : fmt::format("\\x{:02x}", c);
  return o;
}
}  // namespace

TEST(Tokenizer, MatchesHuggingFaceOnEveryFixture) {
  auto cs = cases();
  ASSERT_GT(cs.size(), 300u);
  int bad = 0;
  for (const Case& c : cs) {
    auto ids = fixture_tok().encode(c.bytes);
    EXPECT_EQ(ids, c.ids) << "input: " << show(c.bytes);
    auto ids2 = fixture_tok().encode(c.bytes, {.parse_special = false});
    EXPECT_EQ(ids2, c.ids_no_special) << "input (specials as text): " << show(c.bytes);
    bad += ids != c.ids || ids2 != c.ids_no_special;
  }
  EXPECT_EQ(bad, 0);
}

TEST(Tokenizer, DecodeRoundTripsExactBytes) {
  for (const Case& c : cases()) {
    EXPECT_EQ(fixture_tok().decode(c.ids), c.bytes) << show(c.bytes);
    EXPECT_EQ(fixture_tok().decode(c.ids_no_special), c.bytes) << show(c.bytes);
  }
}

TEST(Tokenizer, SpecialTokensAndConfig) {
  const Tokenizer& t = fixture_tok();
  EXPECT_EQ(t.bos_id(), 0);
  EXPECT_EQ(t.eos_id(), 1);
  EXPECT_FALSE(t.add_bos());  // DeepSeek-V4 convention: the template writes BOS itself
  EXPECT_TRUE(t.is_special(0));
  auto user = t.token_id("<｜User｜>");
  ASSERT_TRUE(user.has_value());
  EXPECT_TRUE(t.is_special(*user));
  auto hole = t.token_id("<｜fim▁hole｜>");
  ASSERT_TRUE(hole.has_value());
  EXPECT_FALSE(t.is_special(*hole));
  EXPECT_EQ(t.encode("<｜User｜>"), std::vector<int32_t>{*user});
  // Non-special added tokens are recognised even when specials are not.
  EXPECT_EQ(t.encode("<｜fim▁hole｜>", {.parse_special = false}), std::vector<int32_t>{*hole});
  EXPECT_EQ(t.decode({0, *user}, /*skip_special=*/true), "");
  EXPECT_EQ(t.decode({0, *user, *hole}, true), "<｜fim▁hole｜>");
  EXPECT_EQ(t.token_text(0), "<｜begin▁of▁sentence｜>");
  // add_special only adds what tokenizer_config.json asks for (nothing here).
  EXPECT_EQ(t.encode("hi", {.add_special = true}), t.encode("hi"));
}

TEST(Tokenizer, InvalidUtf8IsEncodedBytewise) {
  const Tokenizer& t = fixture_tok();
  // Each invalid byte is the byte-level token of that byte; valid runs around it encode alone.
  std::string s = "ab\xff" "cd";
  auto ff = t.token_id(utf8::byte_level().byte_to_str[0xff]);
  ASSERT_TRUE(ff.has_value());
  std::vector<int32_t> want = t.encode("ab");
  want.push_back(*ff);
  auto cd = t.encode("cd");
  want.insert(want.end(), cd.begin(), cd.end());
  EXPECT_EQ(t.encode(s), want);
  EXPECT_EQ(t.decode(t.encode(s)), s);
}

TEST(Tokenizer, StreamDecoderNeverSplitsACharacter) {
  const Tokenizer& t = fixture_tok();
  for (const Case& c : cases()) {
    StreamDecoder sd(t);
    std::string all;
    for (int32_t id : c.ids) {
      std::string piece = sd.push(id);
      ASSERT_TRUE(valid_utf8(piece)) << show(c.bytes);
      all += piece;
    }
    all += sd.flush();
    EXPECT_EQ(all, utf8_sanitize(c.bytes)) << show(c.bytes);
  }
  // A CJK character split over byte tokens appears only once complete.
  std::string zh = "\xe4\xb8\xad";  // 中 as three single-byte tokens
  StreamDecoder sd(t);
  EXPECT_EQ(sd.push(*t.token_id(utf8::byte_level().byte_to_str[0xe4])), "");
  EXPECT_EQ(sd.push(*t.token_id(utf8::byte_level().byte_to_str[0xb8])), "");
  EXPECT_EQ(sd.push(*t.token_id(utf8::byte_level().byte_to_str[0xad])), zh);
  EXPECT_EQ(sd.push(*t.token_id(utf8::byte_level().byte_to_str[0xe4])), "");
  EXPECT_EQ(sd.flush(), "\xEF\xBF\xBD");
}

TEST(Tokenizer, RejectsBadInput) {
  EXPECT_THROW(fixture_tok().decode({-1}), Error);
  EXPECT_THROW(fixture_tok().decode({static_cast<int32_t>(fixture_tok().vocab_size())}), Error);
  EXPECT_THROW(Tokenizer::load("/nonexistent_dir_cm"), Error);
  EXPECT_THROW(Tokenizer::from_json("{not json"), Error);
  EXPECT_THROW(Tokenizer::from_json(R"({"model": {"type": "WordPiece", "vocab": {}}})"), Error);
  auto json_with = [](const std::string& merges, const std::string& pre) {
    return R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": )" + merges +
           R"(}, "pre_tokenizer": )" + pre + "}";
  };
  EXPECT_NO_THROW(Tokenizer::from_json(json_with(R"(["a b"])", "null")));
  EXPECT_NO_THROW(Tokenizer::from_json(json_with(R"([["a", "b"]])", "null")));
  EXPECT_THROW(Tokenizer::from_json(json_with(R"(["a c"])", "null")), Error);
  EXPECT_THROW(Tokenizer::from_json(json_with(R"(["b a"])", "null")), Error);  // "ba" not in vocab
  EXPECT_THROW(Tokenizer::from_json(json_with(R"(["a b c"])", "null")), Error);
  EXPECT_THROW(Tokenizer::from_json(json_with("[]", R"({"type": "Split", "pattern": {"Regex": "(unclosed"}, "behavior": "Isolated"})")), Error);
  EXPECT_THROW(Tokenizer::from_json(json_with("[]", R"({"type": "Split", "pattern": {"Regex": "a"}, "behavior": "Sideways"})")), Error);
  EXPECT_THROW(Tokenizer::from_json(json_with("[]", R"({"type": "Metaspace"})")), Error);
  EXPECT_THROW(Tokenizer::from_json(R"({"model": {"type": "BPE", "vocab": {"a": 2000000000}, "merges": []}})"), Error);
  EXPECT_THROW(Tokenizer::from_json(R"({"model": {"type": "BPE", "vocab": {"a": -1}, "merges": []}})"), Error);
  EXPECT_THROW(Tokenizer::from_json(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
                                       "added_tokens": [{"id": 5, "content": ""}]})"), Error);
  // Merge ranks: with both merges, "ab" comes out as one token, and pairs and strings agree.
  Tokenizer t1 = Tokenizer::from_json(json_with(R"(["a b"])", "null"));
  EXPECT_EQ(t1.encode("abab"), (std::vector<int32_t>{2, 2}));
  EXPECT_EQ(t1.encode("aab"), (std::vector<int32_t>{0, 2}));
}

TEST(Tokenizer, OnigurumaWordClassesAreTranslated) {
  using tok::onig_to_pcre2;
  std::string w = std::string("[") + tok::kOnigWordClass + "]";
  EXPECT_EQ(onig_to_pcre2(R"(\p{N}{1,3})"), R"(\p{N}{1,3})");  // untouched
  EXPECT_EQ(onig_to_pcre2(R"(\w+)"), w + "+");
  EXPECT_EQ(onig_to_pcre2(R"([\w.])"), std::string("[") + tok::kOnigWordClassInSet + ".]");
  EXPECT_EQ(onig_to_pcre2(R"([\b])"), R"([\b])");  // backspace inside a class
  EXPECT_EQ(onig_to_pcre2(R"([]\w])"), std::string("[]") + tok::kOnigWordClassInSet + "]");
  EXPECT_EQ(onig_to_pcre2(R"(\\w)"), R"(\\w)");  // escaped backslash, then a literal w
  EXPECT_THROW(onig_to_pcre2(R"([^\W])"), Error);
  EXPECT_THROW(onig_to_pcre2(R"([\S])"), Error);
  EXPECT_EQ(onig_to_pcre2(R"(\s+(?!\S))"),
            "[" + std::string(tok::kOnigSpaceClass) + "]+(?![^" + tok::kOnigSpaceClass + "])");
  EXPECT_THROW(onig_to_pcre2("[[:alpha:]]"), Error);
  // Matching: a combining mark is a word character for Oniguruma, U+2070 (superscript zero) not.
  tok::Regex re(onig_to_pcre2(R"(\w+)"));
  std::vector<std::pair<size_t, size_t>> m;
  re.find_all("e\xcc\x81x \xe2\x81\xb0", m);
  ASSERT_EQ(m.size(), 1u);
  EXPECT_EQ(m[0], (std::pair<size_t, size_t>{0, 4}));
}

TEST(Tokenizer, EncodeSpeed) {
  // A multi-MB text built from the license texts in the fixture's training set is not available
  // on every machine, so repeat the fixture strings (valid UTF-8 only) to ~4 MB instead.
  std::string text;
  for (const Case& c : cases())
    if (valid_utf8(c.bytes)) text += c.bytes + "\n";
  std::string big;
  while (big.size() < (4u << 20)) big += text;
  auto t0 = std::chrono::steady_clock::now();
  auto ids = fixture_tok().encode(big);
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(fixture_tok().decode(ids), big);
  std::printf("encode: %.1f MB in %.3f s = %.1f MB/s, %zu tokens\n", big.size() / 1e6, s,
              big.size() / 1e6 / s, ids.size());
}

// Token ids must fit int32 and (in the post-processor) name a real token;
// config mistakes name tokenizer_config.json, not tokenizer.json.
TEST(Tokenizer, BadIdsAndFilesAreNamed) {
  auto err = [](const std::string& tj, const std::string& cfg = "") {
    return cm::test::error_of([&] { Tokenizer::from_json(tj, cfg); });
  };
  const std::string model = R"("model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": []})";
  std::string e = err("{" + model + R"(, "added_tokens": [{"id": 4294967297, "content": "<x>"}]})");
  EXPECT_NE(e.find("added token '<x>': token id 4294967297 is outside"), std::string::npos) << e;
  const std::string pp = R"(, "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>"}},
      {"Sequence": {"id": "A"}}], "special_tokens": {"<s>": {"ids": [ID]}}}})";
  auto with_id = [&](const std::string& id) {
    std::string p = pp;
    p.replace(p.find("ID"), 2, id);
    return "{" + model + p;
  };
  e = err(with_id("77"));
  EXPECT_NE(e.find("post_processor token '<s>' has id 77, which is not in the vocabulary"), std::string::npos) << e;
  e = err(with_id("-3"));
  EXPECT_NE(e.find("token id -3 is outside"), std::string::npos) << e;
  EXPECT_EQ(err(with_id("1")), "");
  e = err("{" + model + "}", R"({"add_bos_token": "yes"})");
  EXPECT_NE(e.find("tokenizer_config.json: key 'add_bos_token': expected a boolean, got a string"), std::string::npos)
      << e;
  e = err("{" + model + "}", "{bad");
  EXPECT_EQ(e.rfind("tokenizer_config.json: not valid JSON", 0), 0u) << e;
}

// A pre-tokenizer Sequence nested without end is refused while parsing, not by a stack overflow.
TEST(Tokenizer, DeepNestingIsRefused) {
  std::string pre;
  for (int i = 0; i < 100000; ++i) pre += R"({"type": "Sequence", "pretokenizers": [)";
  pre += "null";
  for (int i = 0; i < 100000; ++i) pre += "]}";
  std::string e = cm::test::error_of([&] {
    Tokenizer::from_json(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, "pre_tokenizer": )" + pre + "}");
  });
  EXPECT_NE(e.find("tokenizer.json: JSON nested deeper than 64 levels"), std::string::npos) << e.substr(0, 200);
}

// Directories and special files where tokenizer files belong are errors naming them.
TEST(Tokenizer, DirectoriesAndFifosAreNotFiles) {
  const fs::path d = fs::temp_directory_path() / ("cm_tokdir_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d / "tokenizer.json");
  auto load_error = [&] { return cm::test::error_of([&] { Tokenizer::load(d.string()); }); };
  std::string e = load_error();
  EXPECT_NE(e.find("tokenizer.json: is a directory"), std::string::npos) << e;
  fs::remove(d / "tokenizer.json");
  fs::copy_file(kDir + "/tokenizer.json", d / "tokenizer.json");
  fs::create_directories(d / "tokenizer_config.json");  // used to read as an empty file: no config
  e = load_error();
  EXPECT_NE(e.find("tokenizer_config.json: is a directory"), std::string::npos) << e;
  fs::remove(d / "tokenizer_config.json");
  ASSERT_EQ(::mkfifo((d / "tokenizer_config.json").c_str(), 0600), 0);
  e = load_error();  // must not block waiting for a writer
  EXPECT_NE(e.find("not a regular file"), std::string::npos) << e;
  fs::remove_all(d);
}
