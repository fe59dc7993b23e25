// Tokenizer: tokenizer.json loading, added-token splitting, encode/decode, streaming decode.
// The behaviour contract (HF order of operations, invalid UTF-8 rule) is in tokenizer.h.
#include "tokenizer/tokenizer.h"

#include <nlohmann/json.hpp>

#include <climits>
#include <filesystem>
#include <unordered_map>

#include "common/error.h"
#include "io/input_file.h"
#include "tokenizer/bpe.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/utf8.h"

namespace cm {

namespace {
using nlohmann::json;

// Rust's char::is_whitespace (Unicode White_Space), which HF uses for lstrip/rstrip.
bool is_white_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

// Byte-wise trie over added-token contents for leftmost-longest matching.
struct Trie {
  struct Node {
    std::vector<std::pair<unsigned char, int32_t>> kids;
    int32_t token = -1;  // index into the added-token list
  };
  std::vector<Node> nodes{1};
  bool first[256] = {};
  bool empty() const { return nodes.size() == 1; }

  void add(const std::string& s, int32_t token) {
    int32_t n = 0;
    for (unsigned char c : s) {
      int32_t child = -1;
      for (auto& [k, v] : nodes[n].kids)
        if (k == c) child = v;
      if (child < 0) {
        child = static_cast<int32_t>(nodes.size());
        nodes[n].kids.emplace_back(c, child);
        nodes.emplace_back();
      }
      n = child;
    }
    if (nodes[n].token < 0) nodes[n].token = token;
    first[static_cast<unsigned char>(s[0])] = true;
  }
  // Longest token starting at s[pos]: returns its index and sets len, or -1.
  int32_t longest(std::string_view s, size_t pos, size_t& len) const {
    int32_t n = 0, best = -1;
    for (size_t i = pos; i < s.size(); ++i) {
      int32_t child = -1;
      for (auto& [k, v] : nodes[n].kids)
        if (k == static_cast<unsigned char>(s[i])) child = v;
      if (child < 0) break;
      n = child;
      if (nodes[n].token >= 0) best = nodes[n].token, len = i + 1 - pos;
    }
    return best;
  }
};

// Appends the valid UTF-8 of `in` to `out`, invalid bytes as U+FFFD. Unless `final`, stops before
// an incomplete trailing character. Returns the number of bytes consumed.
size_t sanitize_append(std::string_view in, bool final, std::string& out) {
  size_t i = 0;
  while (i < in.size()) {
    size_t n = utf8::valid_seq_len(in, i);
    if (n > 0) {
      out.append(in.substr(i, n));
      i += n;
    } else if (!final && utf8::incomplete_prefix(in, i)) {
      break;  // wait for the rest of this character
    } else {
      out += "\xEF\xBF\xBD";
      ++i;
    }
  }
  return i;
}

struct Segment {
  size_t b, e;
  int32_t id;  // added-token id, or -1 for text
};

// "bos_token": "<s>" or {"content": "<s>", ...}
std::optional<std::string> token_string(const json& cfg, const char* key) {
  if (!cfg.contains(key) || cfg[key].is_null()) return std::nullopt;
  if (cfg[key].is_string()) return cfg[key].get<std::string>();
  if (cfg[key].is_object() && cfg[key].contains("content") && cfg[key]["content"].is_string())
    return cfg[key]["content"].get<std::string>();
  fail("tokenizer_config.json: key '{}': expected a string or an object with a string \"content\", got {}", key,
       json_type_name(cfg[key]));
}

bool config_flag(const json& cfg, const char* key, bool def) {
  if (!cfg.contains(key) || cfg[key].is_null()) return def;
  if (!cfg[key].is_boolean())
    fail("tokenizer_config.json: key '{}': expected a boolean, got {}", key, json_type_name(cfg[key]));
  return cfg[key].get<bool>();
}

// A token id from tokenizer.json: an integer in [0, INT32_MAX].
int32_t token_id_value(const json& v, const std::string& what) {
  if (!v.is_number_integer()) fail("tokenizer.json: {}: expected an integer token id, got {}", what, describe_json(v));
  int64_t id = 0;
  if (!json_int_in(v, 0, INT32_MAX, &id))
    fail("tokenizer.json: {}: token id {} is outside [0, {}]", what, v.dump(), INT32_MAX);
  return int32_t(id);
}
}  // namespace

struct Tokenizer::Impl {
  tok::PreTokenizer pre;
  tok::Bpe bpe;
  std::vector<AddedToken> added;
  std::unordered_map<std::string, int32_t> added_by_content;
  Trie trie_raw, trie_norm;  // normalized=false tokens, normalized=true tokens
  std::unique_ptr<tok::Regex> word_char;
  std::vector<std::string> text;   // id -> tokenizer.json string
  std::vector<std::string> bytes;  // id -> decoded bytes
  std::vector<uint8_t> assigned, special;
  int32_t bos = -1, eos = -1;
  bool add_bos = false, add_eos = false;

  void split_added(const Trie& trie, std::string_view s, const Segment& seg, bool parse_special,
                   std::vector<Segment>& out) const;
  void encode_text(std::string_view s, std::vector<int32_t>& out) const;
  // The character at s[i] is a word character (invalid UTF-8 there is not). The regex only ever
  // sees that one valid character, since PCRE2 must not be given invalid UTF-8.
  bool is_word_char(std::string_view s, size_t i) const {
    size_t n = utf8::valid_seq_len(s, i);
    return n > 0 && word_char->matches_at(s.substr(i, n), 0);
  }
  void check_id(int32_t id) const {
    CM_CHECK(id >= 0 && static_cast<size_t>(id) < assigned.size() && assigned[id],
             "token id {} is not in the vocabulary", id);
  }
};

// Finds added tokens inside one text segment the way HF's AddedVocabulary does: Aho-Corasick
// leftmost-longest, non-overlapping; a match that is rejected (special while not parsing
// specials, or single_word violated) stays ordinary text and scanning resumes after it.
void Tokenizer::Impl::split_added(const Trie& trie, std::string_view s, const Segment& seg,
                                  bool parse_special, std::vector<Segment>& out) const {
  if (seg.id >= 0 || trie.empty()) {
    out.push_back(seg);
    return;
  }
  std::string_view sent = s.substr(seg.b, seg.e - seg.b);
  size_t pos = 0, prev_end = 0;
  while (pos < sent.size()) {
    if (!trie.first[static_cast<unsigned char>(sent[pos])]) {
      ++pos;
      continue;
    }
    size_t len = 0;
    int32_t idx = trie.longest(sent, pos, len);
    if (idx < 0) {
      ++pos;
      continue;
    }
    const AddedToken& t = added[idx];
    size_t start = pos, stop = pos + len;
    pos = stop;
    if (t.special && !parse_special) continue;
    if (t.single_word) {
      size_t before = start;
      while (before > 0 && (static_cast<unsigned char>(sent[before - 1]) & 0xC0) == 0x80) --before;
      if (before > 0) --before;
      if ((start > 0 && is_word_char(sent, before)) || (stop < sent.size() && is_word_char(sent, stop)))
        continue;
    }
    if (t.lstrip) {
      while (start > prev_end) {
        size_t b = start - 1;
        while (b > prev_end && (static_cast<unsigned char>(sent[b]) & 0xC0) == 0x80) --b;
        size_t n = utf8::valid_seq_len(sent, b);
        if (n != start - b || !is_white_space(utf8::decode(sent, b, n))) break;
        start = b;
      }
    }
    if (t.rstrip) {
      while (stop < sent.size()) {
        size_t n = utf8::valid_seq_len(sent, stop);
        if (n == 0 || !is_white_space(utf8::decode(sent, stop, n))) break;
        stop += n;
      }
      pos = stop;
    }
    if (start > prev_end) out.push_back({seg.b + prev_end, seg.b + start, -1});
    out.push_back({seg.b + start, seg.b + stop, t.id});
    prev_end = stop;
  }
  if (prev_end < sent.size()) out.push_back({seg.b + prev_end, seg.e, -1});
}

// Valid UTF-8 runs go through pre-tokenizer + BPE; each invalid byte is its own pre-token.
void Tokenizer::Impl::encode_text(std::string_view s, std::vector<int32_t>& out) const {
  auto emit = [&](std::string_view piece) { bpe.encode_word(piece, out); };
  size_t run = 0, i = 0;
  while (i < s.size()) {
    unsigned char c = s[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t n = utf8::valid_seq_len(s, i);
    if (n > 0) {
      i += n;
      continue;
    }
    if (i > run) pre.run(s.substr(run, i - run), emit);
    bpe.encode_word(s.substr(i, 1), out);
    run = ++i;
  }
  if (s.size() > run) pre.run(s.substr(run), emit);
}

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::load(const std::string& dir) {
  namespace fs = std::filesystem;
  fs::path d(dir);
  CM_CHECK(fs::is_directory(d), "tokenizer: {} is not a directory", dir);
  std::error_code ec;
  CM_CHECK(fs::exists(fs::symlink_status(d / "tokenizer.json", ec)), "tokenizer: no tokenizer.json in {}", dir);
  try {
    const bool has_cfg = fs::exists(fs::symlink_status(d / "tokenizer_config.json", ec));
    std::string cfg = has_cfg ? read_regular_file((d / "tokenizer_config.json").string(), kMaxConfigBytes) : "";
    if (has_cfg && cfg.empty()) fail("tokenizer_config.json: the file is empty");
    return from_json(read_regular_file((d / "tokenizer.json").string(), kMaxTokenizerBytes), cfg);
  } catch (const Error& e) {
    fail("{} (in {})", e.what(), dir);
  }
}

Tokenizer Tokenizer::from_json(const std::string& tokenizer_json, const std::string& config_json) {
  auto impl = std::make_unique<Impl>();
  json j = parse_json(tokenizer_json, "tokenizer.json");
  json cfg = config_json.empty() ? json::object() : parse_json(config_json, "tokenizer_config.json");
  CM_CHECK(j.is_object(), "tokenizer.json: top level must be an object");
  CM_CHECK(cfg.is_object(), "tokenizer_config.json: top level must be an object");
  try {
    if (j.contains("normalizer") && !j["normalizer"].is_null()) {
      const json& n = j["normalizer"];
      bool identity = n.value("type", "") == "Sequence" && n.contains("normalizers") &&
                      n["normalizers"].is_array() && n["normalizers"].empty();
      CM_CHECK(identity, "tokenizer.json: normalizer '{}' is not supported (only null)",
               n.value("type", std::string("?")));
    }
    impl->pre = tok::PreTokenizer::from_json(j.value("pre_tokenizer", json()));
    impl->bpe.load(j.at("model"), impl->pre.byte_level());
    bool byte_decoder = false;
    if (j.contains("decoder") && !j["decoder"].is_null()) {
      const json& d = j["decoder"];
      std::string type = d.value("type", "");
      if (type == "Sequence") {
        for (const json& x : d.at("decoders")) {
          CM_CHECK(x.value("type", "") == "ByteLevel", "tokenizer.json: decoder '{}' is not supported",
                   x.value("type", std::string("?")));
        }
        byte_decoder = true;
      } else {
        CM_CHECK(type == "ByteLevel", "tokenizer.json: decoder '{}' is not supported (only ByteLevel)", type);
        byte_decoder = true;
      }
    }

    int64_t size = 0;
    for (const auto& [s, id] : impl->bpe.vocab()) size = std::max<int64_t>(size, id + 1);
    if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
      for (const json& a : j["added_tokens"]) {
        AddedToken t;
        CM_CHECK(a.is_object() && a.contains("id") && a.contains("content") && a["content"].is_string(),
                 "tokenizer.json: added_tokens entries need an integer id and a string content");
        t.content = a["content"].get<std::string>();
        t.id = token_id_value(a["id"], fmt::format("added token '{}'", truncate_text(t.content, 60)));
        CM_CHECK(!t.content.empty(), "tokenizer.json: added token {} has empty content", t.id);
        t.special = a.value("special", false);
        t.lstrip = a.value("lstrip", false);
        t.rstrip = a.value("rstrip", false);
        t.single_word = a.value("single_word", false);
        t.normalized = a.value("normalized", !t.special);
        size = std::max<int64_t>(size, t.id + 1);
        impl->added.push_back(t);
      }
    }
    // Ids index dense tables; a stray huge id would make them enormous, so bound them.
    constexpr int64_t kMaxVocab = 1 << 24;
    CM_CHECK(size <= kMaxVocab, "tokenizer.json: token id {} is too large (limit {})", size - 1, kMaxVocab - 1);
    impl->text.assign(size, "");
    impl->bytes.assign(size, "");
    impl->assigned.assign(size, 0);
    impl->special.assign(size, 0);
    auto set_token = [&](int32_t id, const std::string& s) {
      impl->text[id] = s;
      impl->assigned[id] = 1;
      std::string b;
      impl->bytes[id] = byte_decoder && utf8::from_byte_level(s, b) ? b : s;
    };
    for (const auto& [s, id] : impl->bpe.vocab()) set_token(id, s);
    for (size_t i = 0; i < impl->added.size(); ++i) {
      const AddedToken& t = impl->added[i];
      set_token(t.id, t.content);
      impl->special[t.id] = t.special;
      impl->added_by_content.emplace(t.content, t.id);
      (t.normalized ? impl->trie_norm : impl->trie_raw).add(t.content, static_cast<int32_t>(i));
    }
    // single_word's "word character" is Rust regex's \w (HF matches with it): Alphabetic, marks,
    // decimal digits, connector punctuation, ZWNJ/ZWJ. (PCRE2's \w differs on marks and No.)
    impl->word_char = std::make_unique<tok::Regex>(std::string("[") + tok::kRustWordClass + "]");

    // BOS/EOS: tokenizer_config.json first, then the TemplateProcessing post-processor.
    Tokenizer tk(std::move(impl));
    Impl& m = *tk.impl_;
    int32_t pp_bos = -1, pp_eos = -1;
    if (j.contains("post_processor") && j["post_processor"].is_object() &&
        j["post_processor"].value("type", "") == "TemplateProcessing") {
      const json& pp = j["post_processor"];
      bool seen_seq = false;
      for (const json& piece : pp.value("single", json::array())) {
        if (piece.contains("Sequence")) {
          seen_seq = true;
        } else if (piece.contains("SpecialToken")) {
          std::string name = piece["SpecialToken"].at("id").get<std::string>();
          const json& ids = pp.at("special_tokens").at(name).at("ids");
          name = truncate_text(name, 60);
          CM_CHECK(ids.is_array() && ids.size() == 1, "tokenizer.json: post_processor token '{}' must have one id",
                   name);
          const int32_t id = token_id_value(ids[0], fmt::format("post_processor token '{}'", name));
          CM_CHECK(size_t(id) < m.assigned.size() && m.assigned[size_t(id)],
                   "tokenizer.json: post_processor token '{}' has id {}, which is not in the vocabulary", name, id);
          (seen_seq ? pp_eos : pp_bos) = id;
        }
      }
    }
    auto resolve = [&](const char* key) -> int32_t {
      auto s = token_string(cfg, key);
      if (!s) return -1;
      auto id = tk.token_id(*s);
      CM_CHECK(id.has_value(), "tokenizer_config.json: {} '{}' is not a token of tokenizer.json", key,
               truncate_text(*s, 60));
      return *id;
    };
    m.bos = resolve("bos_token");
    m.eos = resolve("eos_token");
    if (m.bos < 0) m.bos = pp_bos;
    if (m.eos < 0) m.eos = pp_eos;
    m.add_bos = config_flag(cfg, "add_bos_token", pp_bos >= 0);
    m.add_eos = config_flag(cfg, "add_eos_token", pp_eos >= 0);
    CM_CHECK(!m.add_bos || m.bos >= 0, "tokenizer_config.json: add_bos_token is set but no bos_token");
    CM_CHECK(!m.add_eos || m.eos >= 0, "tokenizer_config.json: add_eos_token is set but no eos_token");
    return tk;
  } catch (const json::exception& e) {
    fail("tokenizer.json: {}", truncate_text(e.what(), 200));
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, const EncodeOptions& opt) const {
  const Impl& m = *impl_;
  std::vector<Segment> a{{0, text.size(), -1}}, b;
  for (const Trie* t : {&m.trie_raw, &m.trie_norm}) {
    b.clear();
    for (const Segment& s : a) m.split_added(*t, text, s, opt.parse_special, b);
    a.swap(b);
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  if (opt.add_special && m.add_bos) ids.push_back(m.bos);
  for (const Segment& s : a) {
    if (s.id >= 0) ids.push_back(s.id);
    else m.encode_text(text.substr(s.b, s.e - s.b), ids);
  }
  if (opt.add_special && m.add_eos) ids.push_back(m.eos);
  return ids;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  std::string out;
  for (int32_t id : ids) {
    impl_->check_id(id);
    if (skip_special && impl_->special[id]) continue;
    out += impl_->bytes[id];
  }
  return out;
}

const std::string& Tokenizer::token_bytes(int32_t id) const {
  impl_->check_id(id);
  return impl_->bytes[id];
}

const std::string& Tokenizer::token_text(int32_t id) const {
  impl_->check_id(id);
  return impl_->text[id];
}

std::optional<int32_t> Tokenizer::token_id(std::string_view token) const {
  std::string key(token);
  auto a = impl_->added_by_content.find(key);
  if (a != impl_->added_by_content.end()) return a->second;
  auto v = impl_->bpe.vocab().find(key);
  if (v != impl_->bpe.vocab().end()) return v->second;
  return std::nullopt;
}

int64_t Tokenizer::vocab_size() const { return static_cast<int64_t>(impl_->assigned.size()); }
bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < impl_->special.size() && impl_->special[id];
}
const std::vector<AddedToken>& Tokenizer::added_tokens() const { return impl_->added; }
int32_t Tokenizer::bos_id() const { return impl_->bos; }
int32_t Tokenizer::eos_id() const { return impl_->eos; }
bool Tokenizer::add_bos() const { return impl_->add_bos; }
bool Tokenizer::add_eos() const { return impl_->add_eos; }

StreamDecoder::StreamDecoder(const Tokenizer& tok, bool skip_special)
    : tok_(tok), skip_special_(skip_special) {}

std::string StreamDecoder::drain(bool final) {
  std::string out;
  pending_.erase(0, sanitize_append(pending_, final, out));
  return out;
}

std::string StreamDecoder::push(int32_t id) {
  if (!(skip_special_ && tok_.is_special(id))) pending_ += tok_.token_bytes(id);
  return drain(false);
}

std::string StreamDecoder::flush() { return drain(true); }

std::string utf8_sanitize(std::string_view bytes) {
  std::string out;
  sanitize_append(bytes, true, out);
  return out;
}

}  // namespace cm
