// Structured output: token masks that keep sampling inside a grammar (a JSON schema, any JSON, a
// regex, an EBNF grammar or a list of choices), computed by XGrammar's C++ core
// (scripts/deps_xgrammar.sh; docs/structured-output.md). No XGrammar type appears here.
//
// Once per model:   GrammarCompiler gc(tokenizer, logits_width, stop_ids);
// Once per request: auto spec = parse_request_format(body);          // cm::Error -> 400
//                   if (spec) matcher = gc.matcher(*spec);          // cm::Error -> 400
// Every step:       m.fill_mask(mask.data()); apply_mask(logits, mask.data(), vocab);
//                   sample; m.accept(tok);   (m.rollback(n) undoes n accepted tokens)
#pragma once
#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace cm {

class Tokenizer;

// StructuralTag: XGrammar's structural-tag JSON ({"type": "structural_tag", "format": {...}}),
// which the server builds for tool calls (tags around JSON-schema arguments in a model's own
// syntax, e.g. DeepSeek-V4's DSML); never read from a request.
enum class GrammarKind { JsonObject, JsonSchema, Regex, Ebnf, Choice, StructuralTag };

// What a request asks its output to match. `text` is the schema (JSON text), the regex or the
// EBNF source (root rule `root`); `choices` the allowed strings of a Choice. `source` names the
// request field it came from, for error messages.
struct GrammarSpec {
  GrammarKind kind = GrammarKind::JsonObject;
  std::string text;
  std::vector<std::string> choices;
  bool strict = true;  // JSON schema: no properties beyond those listed (additionalProperties false)
  std::string source;
  // The cache key: kind, strictness and text.
  std::string key() const;
};

// The output format a chat/completions request body asks for, if any: OpenAI `response_format`
// (text | json_object | json_schema), vLLM `structured_outputs` {json, regex, choice, grammar} and
// `guided_json` / `guided_regex` / `guided_choice` / `guided_grammar`, llama.cpp `json_schema` /
// `grammar`. nullopt when none (or response_format text). cm::Error naming the field for a
// malformed shape, and naming both fields when two are given.
std::optional<GrammarSpec> parse_request_format(const nlohmann::json& body);

// Words of a token bitmask for `vocab` tokens: bit (id % 32) of word (id / 32) set = allowed.
inline int64_t mask_words(int64_t vocab) { return (vocab + 31) / 32; }

// Sets logits[i] = -inf for every i < vocab whose bit in `mask` is clear.
void apply_mask(float* logits, const uint32_t* mask, int64_t vocab);

class CompiledGrammar;

// Per-request matching state. Not thread-safe; one per sequence.
class Matcher {
 public:
  ~Matcher();
  Matcher(Matcher&&) noexcept;
  Matcher& operator=(Matcher&&) noexcept;
  // Writes mask_words(vocab_size()) words. Returns false when every token is allowed.
  bool fill_mask(uint32_t* mask);
  // Advances by one token; false (state unchanged) when the grammar does not allow it.
  bool accept(int32_t token);
  // Undoes the last n accepted tokens (speculative decoding).
  void rollback(int n);
  // A stop token was accepted after a complete match: nothing more may be generated.
  bool is_terminated() const;
  // The text so far is a complete match (a stop token may now end it).
  bool is_completed() const;
  int64_t vocab_size() const;

 private:
  friend class GrammarCompiler;
  struct Impl;
  explicit Matcher(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// One per model: the vocabulary as XGrammar sees it, and a cache of compiled grammars by spec.
// Thread-safe.
class GrammarCompiler {
 public:
  // vocab_size: the logits width (may exceed tokenizer.vocab_size(); ids past the tokenizer are
  // never allowed). stop_ids: the ids that end generation (empty: the tokenizer's EOS).
  GrammarCompiler(const Tokenizer& tokenizer, int64_t vocab_size, std::vector<int32_t> stop_ids = {});
  // From decoded byte strings directly (tests, tools): vocab[i] = bytes of id i.
  GrammarCompiler(const std::vector<std::string>& vocab, int64_t vocab_size, std::vector<int32_t> stop_ids);
  ~GrammarCompiler();
  GrammarCompiler(const GrammarCompiler&) = delete;
  GrammarCompiler& operator=(const GrammarCompiler&) = delete;

  // Compiles (or finds in the cache) the spec's grammar. cm::Error naming the problem when it
  // cannot be compiled.
  std::shared_ptr<const CompiledGrammar> compile(const GrammarSpec& spec);
  Matcher matcher(const GrammarSpec& spec);
  Matcher matcher(const std::shared_ptr<const CompiledGrammar>& grammar);
  int64_t vocab_size() const;
  size_t cache_entries() const;

 private:
  struct Impl;
  static std::unique_ptr<Impl> make_impl(const std::vector<std::string>& vocab, int64_t vocab_size,
                                         std::vector<int32_t> stop_ids);
  std::unique_ptr<Impl> impl_;
};

}  // namespace cm
