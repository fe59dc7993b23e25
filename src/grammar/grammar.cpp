// src/grammar over XGrammar's C++ core: the tokenizer's bytes as a RAW vocabulary, a cache of
// compiled grammars keyed by spec, a matcher that fills uint32 bitmasks.
#include "grammar/grammar.h"

#include <dlpack/dlpack.h>
#include <fmt/format.h>
#include <xgrammar/xgrammar.h>

#include <cmath>
#include <limits>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "tokenizer/tokenizer.h"

namespace cm {

class CompiledGrammar {
 public:
  CompiledGrammar(xgrammar::CompiledGrammar g, bool json) : g(std::move(g)), json(json) {}
  xgrammar::CompiledGrammar g;
  bool json;  // JSON output: tokens with a control byte JSON never allows raw are masked too
};

std::string GrammarSpec::key() const {
  std::string k = fmt::format("{}:{}:", static_cast<int>(kind), strict ? 1 : 0);
  if (kind == GrammarKind::Choice) {
    k += nlohmann::json(choices).dump();
  } else {
    k += text;
  }
  return k;
}

void apply_mask(float* logits, const uint32_t* mask, int64_t vocab) {
  const float ninf = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < vocab; ++i) {
    if (!((mask[i >> 5] >> (i & 31)) & 1u)) logits[i] = ninf;
  }
}

namespace {

// An EBNF string literal for arbitrary UTF-8 text.
std::string ebnf_literal(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c == 0x7f) {
      out += fmt::format("\\x{:02x}", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

const char* kind_name(GrammarKind k) {
  switch (k) {
    case GrammarKind::JsonObject: return "JSON";
    case GrammarKind::JsonSchema: return "JSON schema";
    case GrammarKind::Regex: return "regex";
    case GrammarKind::Ebnf: return "grammar";
    case GrammarKind::Choice: return "choice";
    case GrammarKind::StructuralTag: return "structural tag";
  }
  return "?";
}

}  // namespace

// ---- Matcher

struct Matcher::Impl {
  xgrammar::GrammarMatcher m;
  int64_t vocab;
  // For JSON grammars: the tokens free of control bytes other than \t \n \r (XGrammar's JSON
  // strings let U+0001..U+001F through unescaped, which JSON parsers reject); null otherwise.
  std::shared_ptr<const std::vector<uint32_t>> json_safe;
};

Matcher::Matcher(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Matcher::~Matcher() = default;
Matcher::Matcher(Matcher&&) noexcept = default;
Matcher& Matcher::operator=(Matcher&&) noexcept = default;

bool Matcher::fill_mask(uint32_t* mask) {
  int64_t shape[1] = {mask_words(impl_->vocab)};
  DLTensor t{};
  t.data = mask;
  t.device = DLDevice{kDLCPU, 0};
  t.ndim = 1;
  t.dtype = xgrammar::GetBitmaskDLType();
  t.shape = shape;
  t.strides = nullptr;
  t.byte_offset = 0;
  bool masked = impl_->m.FillNextTokenBitmask(&t);
  if (impl_->json_safe) {
    const auto& safe = *impl_->json_safe;
    for (size_t w = 0; w < safe.size(); ++w) mask[w] &= safe[w];
    masked = true;
  }
  return masked;
}

bool Matcher::accept(int32_t token) {
  if (token < 0 || token >= impl_->vocab) return false;
  if (impl_->json_safe && !(((*impl_->json_safe)[token >> 5] >> (token & 31)) & 1u)) return false;
  return impl_->m.AcceptToken(token);
}

void Matcher::rollback(int n) {
  if (n > 0) impl_->m.Rollback(n);
}

bool Matcher::is_terminated() const { return impl_->m.IsTerminated(); }
bool Matcher::is_completed() const { return impl_->m.IsCompleted(); }
int64_t Matcher::vocab_size() const { return impl_->vocab; }

// ---- GrammarCompiler

struct GrammarCompiler::Impl {
  int64_t vocab;
  std::optional<xgrammar::GrammarCompiler> xc;
  std::mutex mu;
  std::map<std::string, std::shared_ptr<const CompiledGrammar>> cache;
  std::shared_ptr<const std::vector<uint32_t>> json_safe;
};

std::unique_ptr<GrammarCompiler::Impl> GrammarCompiler::make_impl(const std::vector<std::string>& vocab,
                                                                  int64_t vocab_size, std::vector<int32_t> stop_ids) {
  CM_CHECK(vocab_size >= static_cast<int64_t>(vocab.size()) && vocab_size <= std::numeric_limits<int>::max(),
           "grammar: vocab size {} is below the tokenizer's {}", vocab_size, vocab.size());
  CM_CHECK(!stop_ids.empty(), "grammar: no stop token id (the tokenizer has no EOS)");
  for (int32_t id : stop_ids) {
    CM_CHECK(id >= 0 && id < vocab_size, "grammar: stop id {} outside the vocabulary ({})", id, vocab_size);
  }
  auto impl = std::make_unique<GrammarCompiler::Impl>();
  impl->vocab = vocab_size;
  xgrammar::TokenizerInfo info(vocab, xgrammar::VocabType::RAW, static_cast<int>(vocab_size),
                               std::move(stop_ids), false);
  impl->xc.emplace(info, /*max_threads=*/1, /*cache_enabled=*/false);
  auto safe = std::make_shared<std::vector<uint32_t>>(mask_words(vocab_size), ~0u);
  for (size_t i = 0; i < vocab.size(); ++i) {
    for (unsigned char c : vocab[i]) {
      if (c < 0x20 && c != '\t' && c != '\n' && c != '\r') {
        (*safe)[i >> 5] &= ~(1u << (i & 31));
        break;
      }
    }
  }
  impl->json_safe = std::move(safe);
  return impl;
}

GrammarCompiler::GrammarCompiler(const Tokenizer& tok, int64_t vocab_size, std::vector<int32_t> stop_ids) {
  std::vector<std::string> vocab(tok.vocab_size());
  for (int64_t i = 0; i < tok.vocab_size(); ++i) {
    // Special tokens are given as "" so XGrammar never lets grammar text match them.
    if (!tok.is_special(static_cast<int32_t>(i))) vocab[i] = tok.token_bytes(static_cast<int32_t>(i));
  }
  if (stop_ids.empty() && tok.eos_id() >= 0) stop_ids.push_back(tok.eos_id());
  impl_ = make_impl(vocab, vocab_size, std::move(stop_ids));
}

GrammarCompiler::GrammarCompiler(const std::vector<std::string>& vocab, int64_t vocab_size,
                                 std::vector<int32_t> stop_ids)
    : impl_(make_impl(vocab, vocab_size, std::move(stop_ids))) {}

GrammarCompiler::~GrammarCompiler() = default;
int64_t GrammarCompiler::vocab_size() const { return impl_->vocab; }

size_t GrammarCompiler::cache_entries() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->cache.size();
}

std::shared_ptr<const CompiledGrammar> GrammarCompiler::compile(const GrammarSpec& spec) {
  const std::string key = spec.key();
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    auto it = impl_->cache.find(key);
    if (it != impl_->cache.end()) return it->second;
  }
  const std::string where = spec.source.empty() ? std::string(kind_name(spec.kind)) : spec.source;
  std::optional<xgrammar::CompiledGrammar> g;
  try {
    auto& xc = *impl_->xc;
    switch (spec.kind) {
      case GrammarKind::JsonObject:
        // OpenAI's json_object mode promises an object (the builtin JSON grammar also allows an
        // array or a scalar) and, like the schemas below, no free whitespace: a generation cannot
        // wander in blank lines and run out of tokens before the object closes.
        g.emplace(xc.CompileJSONSchema(R"({"type": "object"})", /*any_whitespace=*/false, std::nullopt, std::nullopt,
                                       /*strict_mode=*/false));
        break;
      case GrammarKind::JsonSchema: {
        auto parsed = nlohmann::json::parse(spec.text, nullptr, false);
        CM_CHECK(!parsed.is_discarded(), "{}: the schema is not valid JSON", where);
        CM_CHECK(parsed.is_object() || parsed.is_boolean(), "{}: the schema must be a JSON object", where);
        // Compact separators (", " and ": "), no free whitespace: the output is one line and a
        // generation cannot wander in whitespace.
        g.emplace(xc.CompileJSONSchema(spec.text, /*any_whitespace=*/false, std::nullopt, std::nullopt,
                                       /*strict_mode=*/spec.strict));
        break;
      }
      case GrammarKind::Regex:
        g.emplace(xc.CompileRegex(spec.text));
        break;
      case GrammarKind::Ebnf:
        g.emplace(xc.CompileGrammar(spec.text, "root"));
        break;
      case GrammarKind::Choice: {
        CM_CHECK(!spec.choices.empty(), "{}: the choice list is empty", where);
        std::string ebnf = "root ::= ";
        for (size_t i = 0; i < spec.choices.size(); ++i) {
          if (i) ebnf += " | ";
          ebnf += ebnf_literal(spec.choices[i]);
        }
        g.emplace(xc.CompileGrammar(ebnf, "root"));
        break;
      }
      case GrammarKind::StructuralTag:
        g.emplace(xc.CompileStructuralTag(spec.text));
        break;
    }
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    std::string msg = e.what();
    while (!msg.empty() && (msg.back() == '\n' || msg.back() == ' ')) msg.pop_back();
    // XGrammar's log prefix ("[08:20:47] ../cpp/json_schema_converter.cc:5082: ") means nothing
    // to a client.
    if (!msg.empty() && msg[0] == '[') {
      const size_t t = msg.find("] ");
      const size_t colon = t == std::string::npos ? t : msg.find(": ", t + 2);
      if (colon != std::string::npos) msg.erase(0, colon + 2);
    }
    fail("{}: cannot compile the {}: {}", where, kind_name(spec.kind), msg);
  }
  // Structural tags (tool calls) hold JSON arguments too; their literal parts need no control byte
  // but newline.
  const bool json = spec.kind == GrammarKind::JsonObject || spec.kind == GrammarKind::JsonSchema ||
                    spec.kind == GrammarKind::StructuralTag;
  auto cg = std::make_shared<const CompiledGrammar>(std::move(*g), json);
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->cache.emplace(key, cg).first->second;
}

Matcher GrammarCompiler::matcher(const GrammarSpec& spec) { return matcher(compile(spec)); }

Matcher GrammarCompiler::matcher(const std::shared_ptr<const CompiledGrammar>& grammar) {
  CM_CHECK(grammar != nullptr, "grammar: matcher of a null grammar");
  auto impl = std::unique_ptr<Matcher::Impl>(new Matcher::Impl{
      xgrammar::GrammarMatcher(grammar->g), impl_->vocab, grammar->json ? impl_->json_safe : nullptr});
  return Matcher(std::move(impl));
}

}  // namespace cm
