// Structured output in the engine (runtime/grammar_gate.h): jobs with a grammar on the default
// model (random weights: it writes gibberish on its own) always produce text the grammar accepts
// and end "stop"; min_tokens cannot deadlock a complete grammar; thinking mode's grammar starts
// after </think>; a DeepSeek-V4 tool-call grammar (serve/structured.h) always yields a block the
// chat parser turns into calls of the listed tools.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <set>

#include "chat/dsv4.h"
#include "factory/factory.h"
#include "grammar/grammar.h"
#include "model/model.h"
#include "runtime/engine.h"
#include "runtime/grammar_gate.h"
#include "serve/structured.h"
#include "tokenizer/tokenizer.h"

using namespace cm;
using namespace cm::runtime;
using nlohmann::json;

namespace {
const std::string kDefault = std::string(CLAWMINE_TEST_DATA) + "/../../models/default";

struct Fixture {
  std::unique_ptr<Model> m = model_load(kDefault);
  Tokenizer tok = Tokenizer::load(kDefault);
  std::shared_ptr<GrammarCompiler> gc =
      std::make_shared<GrammarCompiler>(tok, m->config.vocab_size, std::vector<int32_t>{tok.eos_id()});
  std::unique_ptr<ModelBackend> be = make_backend(*m, Device::CPU);
  std::unique_ptr<Engine> engine;
  Fixture() {
    EngineOptions o;
    o.max_seqs = 2;
    o.ctx = 512;
    o.eos_ids = {tok.eos_id()};
    engine = std::make_unique<Engine>(*be, &tok, m->config.vocab_size, o, nullptr);
  }
  std::shared_ptr<JobGrammar> grammar(GrammarKind kind, std::string text, std::vector<std::string> choices = {}) {
    GrammarSpec s;
    s.kind = kind;
    s.text = std::move(text);
    s.choices = std::move(choices);
    auto g = std::make_shared<JobGrammar>();
    g->compiler = gc;
    g->grammar = gc->compile(s);
    return g;
  }
  JobEvent run(JobSpec spec, std::string* text) {
    text->clear();
    return engine->generate(std::move(spec), [&](const JobEvent& e) { *text += e.text; });
  }
};

Fixture& fx() {
  static Fixture f;
  return f;
}

JobSpec job(uint64_t seed, int64_t max_tokens) {
  JobSpec s;
  s.prompt = fx().tok.encode("The history of tea");
  s.max_tokens = max_tokens;
  s.sampling.temperature = 1.0f;
  s.sampling.seed = seed;
  return s;
}
}  // namespace

TEST(RuntimeGrammar, JsonSchemaOutputsValidateOnEverySeed) {
  auto g = fx().grammar(GrammarKind::JsonSchema, R"({"type": "object", "properties": {
      "name": {"type": "string", "maxLength": 6},
      "kind": {"enum": ["alpha", "beta"]},
      "tags": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "maxItems": 3},
      "inner": {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}},
      "required": ["name", "kind", "tags", "inner"], "additionalProperties": false})");
  std::set<std::string> distinct;
  for (uint64_t seed = 0; seed < 6; ++seed) {
    JobSpec s = job(seed, 200);
    s.constraint = g;
    std::string text;
    JobEvent fin = fx().run(s, &text);
    EXPECT_EQ(fin.finish_reason, "stop") << text;
    EXPECT_TRUE(fin.eos);
    json j = json::parse(text, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << "seed " << seed << ": " << text;
    EXPECT_LE(j["name"].get<std::string>().size(), 6u);
    EXPECT_TRUE(j["kind"] == "alpha" || j["kind"] == "beta") << text;
    EXPECT_LE(j["tags"].size(), 3u);
    EXPECT_TRUE(j["inner"]["ok"].is_boolean());
    distinct.insert(text);
  }
  EXPECT_GT(distinct.size(), 3u);
}

TEST(RuntimeGrammar, RegexAndGreedy) {
  auto g = fx().grammar(GrammarKind::Regex, "[a-c]{2}-[0-9]{1,3}");
  for (uint64_t seed = 0; seed < 5; ++seed) {
    JobSpec s = job(seed, 40);
    s.constraint = g;
    if (seed == 0) s.sampling.temperature = 0;  // greedy: the argmax of the allowed tokens
    std::string text;
    JobEvent fin = fx().run(s, &text);
    EXPECT_TRUE(std::regex_match(text, std::regex("[a-c]{2}-[0-9]{1,3}"))) << text;
    EXPECT_EQ(fin.finish_reason, "stop");
  }
}

// min_tokens bans EOS, but a complete grammar allows nothing else: the grammar wins (no error,
// no run to max_tokens), and ignore_eos does not make the job run on either.
TEST(RuntimeGrammar, MinTokensAndIgnoreEosDoNotDeadlock) {
  auto g = fx().grammar(GrammarKind::Choice, "", {"yes", "no"});
  JobSpec s = job(3, 30);
  s.constraint = g;
  s.min_tokens = 20;
  s.ignore_eos = true;
  std::string text;
  JobEvent fin = fx().run(s, &text);
  EXPECT_TRUE(text == "yes" || text == "no") << text;
  EXPECT_EQ(fin.finish_reason, "stop");
  EXPECT_LT(fin.completion_tokens, 20);
}

// An unbounded grammar at max_tokens ends "length" with the text so far (a prefix of a match).
TEST(RuntimeGrammar, UnboundedGrammarEndsWithLength) {
  auto g = fx().grammar(GrammarKind::Regex, "a[a-z ]*");
  JobSpec s = job(1, 8);
  s.constraint = g;
  std::string text;
  JobEvent fin = fx().run(s, &text);
  EXPECT_EQ(fin.finish_reason, "length");
  EXPECT_EQ(fin.completion_tokens, 8);
  EXPECT_TRUE(std::regex_match(text, std::regex("a[a-z ]*"))) << text;
}

// A grammar whose vocabulary is not the logits width ends the job with an error, not a crash.
TEST(RuntimeGrammar, WrongWidthIsAnError) {
  auto small = std::make_shared<GrammarCompiler>(std::vector<std::string>{"", "a", "b"}, 3, std::vector<int32_t>{0});
  GrammarSpec spec;
  spec.kind = GrammarKind::Regex;
  spec.text = "a+";
  auto g = std::make_shared<JobGrammar>();
  g->compiler = small;
  g->grammar = small->compile(spec);
  JobSpec s = job(1, 8);
  s.constraint = g;
  std::string text;
  JobEvent fin = fx().run(s, &text);
  EXPECT_EQ(fin.finish_reason, "error");
  EXPECT_NE(fin.error.find("logits width"), std::string::npos) << fin.error;
}

// Thinking mode: free until the after_token, EOS banned there; then the grammar's mask.
TEST(RuntimeGrammar, GateStartsAfterItsToken) {
  const int64_t vocab = fx().gc->vocab_size();
  auto g = fx().grammar(GrammarKind::Choice, "", {"no"});
  const int32_t think_end = fx().tok.encode(std::string(chat::kThinkEnd)).at(0);
  g->after_token = think_end;
  const int32_t eos = fx().tok.eos_id();
  auto gate = g->make(vocab, {eos});
  std::vector<float> row(size_t(vocab), 0.0f);
  const std::vector<int32_t> none;
  TokenConstraint::Constrained c = gate->constrain(row.data(), none);
  EXPECT_EQ(c.row, row.data());  // reasoning: no mask
  EXPECT_NE(std::find(c.banned->begin(), c.banned->end(), eos), c.banned->end());
  const int32_t x = fx().tok.encode("x").at(0);
  EXPECT_EQ(gate->accept(x), TokenConstraint::Step::Ok);
  EXPECT_EQ(gate->accept(think_end), TokenConstraint::Step::Ok);
  c = gate->constrain(row.data(), none);
  int64_t finite = 0;
  for (int64_t i = 0; i < vocab; ++i) finite += std::isfinite(c.row[i]);
  EXPECT_GT(finite, 0);
  EXPECT_LT(finite, 10);  // only tokens that start "no"
  EXPECT_FALSE(std::isfinite(c.row[eos]));
  EXPECT_EQ(gate->accept(x), TokenConstraint::Step::Rejected);
  for (int32_t id : fx().tok.encode("no")) EXPECT_EQ(gate->accept(id), TokenConstraint::Step::Ok);
  EXPECT_EQ(gate->accept(eos), TokenConstraint::Step::Terminated);
}

// tool_choice's grammar: a walk over the allowed tokens (uniform at random, so every branch is
// taken: several calls, optional parameters, both tools) always ends in a DSML block that the
// strict DeepSeek-V4 parser reads into calls of listed tools with arguments in their schemas.
// (The engine path is the same mask as above; the model would only make it slower.)
TEST(RuntimeGrammar, ToolCallGrammarYieldsParsableCalls) {
  const nlohmann::ordered_json tools = nlohmann::ordered_json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
      "city": {"type": "string", "enum": ["Paris", "Tokyo"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7},
      "note": {"type": "string", "maxLength": 4}, "opts": {"type": "array", "items": {"type": "boolean"}, "maxItems": 2}},
      "required": ["city", "days"]}}},
    {"type": "function", "function": {"name": "now"}}])");
  const int64_t vocab = fx().gc->vocab_size();
  const int32_t eos = fx().tok.eos_id();
  std::set<std::string> names_seen;
  for (const std::string name : {"", "get_weather"}) {
    GrammarSpec spec;
    spec.kind = GrammarKind::StructuralTag;
    spec.text = serve::tool_call_structural_tag(tools, name);
    auto g = std::make_shared<JobGrammar>();
    g->compiler = fx().gc;
    g->grammar = fx().gc->compile(spec);
    for (uint32_t seed = 0; seed < 20; ++seed) {
      auto gate = g->make(vocab, {eos});
      std::vector<float> row(size_t(vocab), 0.0f);
      std::mt19937 rng(seed);
      std::vector<int32_t> out;
      TokenConstraint::Step st = TokenConstraint::Step::Ok;
      for (int i = 0; i < 5000 && st == TokenConstraint::Step::Ok; ++i) {
        const float* r = gate->constrain(row.data(), {}).row;
        std::vector<int32_t> ok;
        for (int64_t t = 0; t < vocab; ++t)
          if (std::isfinite(r[t])) ok.push_back(int32_t(t));
        ASSERT_FALSE(ok.empty());
        // Prefer ending when allowed, so a walk does not wander through endless calls.
        const int32_t t = std::find(ok.begin(), ok.end(), eos) != ok.end() && rng() % 2 ? eos : ok[rng() % ok.size()];
        st = gate->accept(t);
        if (t != eos) out.push_back(t);
      }
      ASSERT_EQ(st, TokenConstraint::Step::Terminated);
      const std::string text = fx().tok.decode(out);
      chat::Completion c = chat::parse_completion(text + std::string(chat::kEos), chat::Mode::Chat);
      EXPECT_EQ(c.content, "");
      ASSERT_FALSE(c.tool_calls.empty()) << text;
      if (!name.empty()) EXPECT_EQ(c.tool_calls.size(), 1u);
      for (const chat::ToolCall& call : c.tool_calls) {
        names_seen.insert(call.name);
        json a = json::parse(call.arguments, nullptr, false);
        ASSERT_FALSE(a.is_discarded()) << call.arguments;
        if (call.name == "now") {
          EXPECT_TRUE(name.empty());
          EXPECT_EQ(a, json::object());
          continue;
        }
        ASSERT_EQ(call.name, "get_weather");
        EXPECT_TRUE(a["city"] == "Paris" || a["city"] == "Tokyo") << call.arguments;
        EXPECT_GE(a["days"].get<int>(), 1);
        EXPECT_LE(a["days"].get<int>(), 7);
        if (a.contains("note")) EXPECT_LE(a["note"].get<std::string>().size(), 4u);
        if (a.contains("opts")) EXPECT_LE(a["opts"].size(), 2u);
      }
    }
  }
  EXPECT_EQ(names_seen, (std::set<std::string>{"get_weather", "now"}));
}
