// Text <-> token ids for Hugging Face `tokenizer.json` byte-level BPE vocabularies
// (DeepSeek-V3/V4 and any other file using the same features), plus tokenizer_config.json.
//
// Supported tokenizer.json features: normalizer null (or an empty Sequence); pre_tokenizer
// Sequence of Split (Regex/String, all behaviors, invert) ending in ByteLevel (add_prefix_space,
// use_regex); model BPE (merges as strings or pairs, ignore_merges, byte_fallback, unk_token,
// fuse_unk); added_tokens (special flag, lstrip, rstrip, single_word); decoder ByteLevel or null;
// post_processor TemplateProcessing (only to learn BOS/EOS when tokenizer_config.json is silent).
// Anything else is rejected with a cm::Error naming the feature. Regexes are Oniguruma syntax in
// the file and run on PCRE2 after rewriting \w \W \b \B \s \S to Oniguruma's sets (POSIX
// [:class:] sets are rejected). Known remaining difference from `tokenizers`: characters assigned
// after Unicode 14 (PCRE2 10.42's tables) have no \p{..} properties here.
// Verified: identical ids to `tokenizers` on the real DeepSeek-V4 tokenizer.json (17.5 MB of text,
// 4.9M tokens) and on tens of thousands of random strings (tests/tokenizer_diff.py).
//
// Encoding, in HF order:
//   1. Added tokens are split out of the raw text first (leftmost-longest match, tokens with
//      normalized=false first, then the others, as HF does). Special tokens are only recognised
//      when EncodeOptions::parse_special is true; otherwise they are encoded as ordinary text
//      (HF `encode_special_tokens=True`). Non-special added tokens are always recognised.
//   2. INVALID UTF-8 (bytes input; HF's Python API only accepts str and cannot express it):
//      each byte that does not belong to a valid UTF-8 sequence (strict decoding, identical to
//      Python's bytes.decode("utf-8", "surrogateescape")) becomes its own pre-token, i.e. it is
//      encoded as the single byte-level token of that byte; the valid runs between such bytes are
//      encoded independently. So decode(encode(bytes)) == bytes for every input.
//   3. Each valid run goes through the pre-tokenizer and the BPE model.
//   4. With EncodeOptions::add_special, BOS/EOS are added as tokenizer_config.json says
//      (add_bos_token / add_eos_token; DeepSeek-V4 sets both false).
// Decoding maps ids back to their exact bytes (no lossy replacement; use StreamDecoder or
// utf8-sanitise for display).
//
// Usage:
//   auto tok = cm::Tokenizer::load("/models/DeepSeek-V4-Flash");   // tokenizer.json (+config)
//   std::vector<int32_t> ids = tok.encode(prompt);                  // specials parsed
//   cm::StreamDecoder sd(tok);  for (id : generated) std::cout << sd.push(id);  std::cout << sd.flush();
// Thread-safety: a loaded Tokenizer is safe to use from several threads (the BPE cache is locked).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace cm {

struct EncodeOptions {
  bool parse_special = true;  // recognise special added tokens in the text
  bool add_special = false;   // add BOS/EOS per tokenizer_config.json (add_bos_token/add_eos_token)
};

struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool special = false, lstrip = false, rstrip = false, single_word = false, normalized = false;
};

class Tokenizer {
 public:
  // Reads DIR/tokenizer.json and, if present, DIR/tokenizer_config.json. cm::Error on problems.
  static Tokenizer load(const std::string& dir);
  // From the file contents (config_json may be empty).
  static Tokenizer from_json(const std::string& tokenizer_json, const std::string& config_json = "");

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  std::vector<int32_t> encode(std::string_view text, const EncodeOptions& opt = {}) const;
  // Exact bytes of the ids; cm::Error for an id outside the vocabulary.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const;
  // Bytes one id decodes to (what decode({id}) returns).
  const std::string& token_bytes(int32_t id) const;
  // The token's own string in tokenizer.json (byte-level form, e.g. "Ġthe"), for debugging.
  const std::string& token_text(int32_t id) const;
  // Id of a token string (vocabulary entry or added-token content).
  std::optional<int32_t> token_id(std::string_view token) const;

  int64_t vocab_size() const;  // largest id + 1
  bool is_special(int32_t id) const;
  const std::vector<AddedToken>& added_tokens() const;
  int32_t bos_id() const;  // -1 if unknown
  int32_t eos_id() const;  // -1 if unknown
  bool add_bos() const;
  bool add_eos() const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Incremental detokenizer for streaming output: push() returns only complete UTF-8 characters;
// an incomplete trailing sequence is held back until the next id completes it. Bytes that can
// never form valid UTF-8 are emitted as U+FFFD, so the output is always valid UTF-8. flush()
// returns what is still held (incomplete tail -> U+FFFD).
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tok, bool skip_special = false);
  std::string push(int32_t id);
  std::string flush();

 private:
  std::string drain(bool final);
  const Tokenizer& tok_;
  bool skip_special_;
  std::string pending_;
};

// Valid UTF-8 copy of `bytes` with every invalid byte replaced by U+FFFD.
std::string utf8_sanitize(std::string_view bytes);

}  // namespace cm
