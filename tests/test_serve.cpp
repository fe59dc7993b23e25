// The server's pure parts: request parsing and validation, the chat streamer (reasoning apart
// from content, DSML tool calls) and the OpenAI responder on scripted model outputs, and the
// scheduler over a scripted ModelBackend double (batching, chunked prefill, prefix reuse,
// cancellation, per-request determinism). The real model behind HTTP is tested by
// tests/server_test.py.
#include <gtest/gtest.h>

#include <map>

#include "chat/dsv4.h"
#include "common/error.h"
#include "serve/chat_stream.h"
#include "runtime/engine.h"
#include "serve/metrics.h"
#include "serve/openai.h"
#include "serve/request.h"
#include "tokenizer/tokenizer.h"

using namespace cm;
using namespace cm::serve;
using namespace cm::runtime;
using Json = nlohmann::ordered_json;

namespace {
const Tokenizer& tokenizer() {
  static Tokenizer t = Tokenizer::load(std::string(CLAWMINE_TEST_DATA) + "/tokenizer");
  return t;
}

ApiError parse_error(const std::string& body, Endpoint ep = Endpoint::Completions) {
  ParseResult r = parse_request(body, ep, {});
  EXPECT_TRUE(r.error.has_value()) << body;
  return r.error.value_or(ApiError{});
}

// What a DeepSeek-V4 model writes for an assistant message (the encoder's rendering of it,
// without the final EOS).
std::string model_output(const Json& assistant) {
  Json msgs = Json::array({{{"role", "user"}, {"content", "q"}}, assistant});
  std::string full = chat::encode_messages(msgs, {chat::Mode::Chat, true, true, ""});
  std::string out = full.substr(full.rfind(chat::kThinkEnd) + chat::kThinkEnd.size());
  EXPECT_EQ(out.substr(out.size() - chat::kEos.size()), chat::kEos);
  return out.substr(0, out.size() - chat::kEos.size());
}
}  // namespace

TEST(ServeRequest, ParsesCompletionFields) {
  ParseResult r = parse_request(
      R"({"model":"m","prompt":"hi","max_tokens":5,"temperature":0.5,"top_p":0.9,"top_k":-1,"min_p":0.1,
          "presence_penalty":1,"frequency_penalty":-1,"repetition_penalty":1.1,"seed":7,"stop":["a","b"],
          "stream":true,"stream_options":{"include_usage":true},"logprobs":3,"ignore_eos":true,
          "stop_token_ids":[9,12],"min_tokens":2})",
      Endpoint::Completions, {});
  ASSERT_FALSE(r.error) << r.error->message;
  const ApiRequest& q = *r.request;
  EXPECT_EQ(q.model, "m");
  EXPECT_EQ(*q.prompt_text, "hi");
  EXPECT_EQ(*q.max_tokens, 5);
  EXPECT_FLOAT_EQ(q.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(q.sampling.top_p, 0.9f);
  EXPECT_EQ(q.sampling.top_k, 0);
  EXPECT_FLOAT_EQ(q.sampling.repetition_penalty, 1.1f);
  EXPECT_EQ(q.sampling.seed, 7u);
  EXPECT_TRUE(q.seed_given);
  EXPECT_EQ(q.stop, (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(q.stream && q.include_usage && q.ignore_eos);
  EXPECT_EQ(q.logprobs, 3);
  EXPECT_EQ(q.stop_token_ids, (std::vector<int32_t>{9, 12}));
  EXPECT_EQ(q.min_tokens, 2);
  EXPECT_EQ(parse_error(R"({"prompt":"x","stop_token_ids":[-1]})").param, "stop_token_ids");
  EXPECT_EQ(parse_error(R"({"prompt":"x","stop_token_ids":3})").param, "stop_token_ids");
  EXPECT_EQ(parse_error(R"({"prompt":"x","min_tokens":-1})").param, "min_tokens");
  // Defaults: OpenAI's temperature 1 unless generation_config says otherwise.
  EXPECT_FLOAT_EQ(parse_request(R"({"prompt":[1,2,3]})", Endpoint::Completions, {}).request->sampling.temperature, 1.f);
  RequestDefaults d;
  d.temperature = 0.f;
  EXPECT_FLOAT_EQ(parse_request(R"({"prompt":"x"})", Endpoint::Completions, d).request->sampling.temperature, 0.f);
  EXPECT_EQ(parse_request(R"({"prompt":[1,2,3]})", Endpoint::Completions, {}).request->prompt_tokens,
            (std::vector<int32_t>{1, 2, 3}));
}

TEST(ServeRequest, RejectsBadInputNamingTheField) {
  EXPECT_EQ(parse_error("{not json").message, "request body is not valid JSON");
  EXPECT_EQ(parse_error("[1,2]").message, "request body must be a JSON object");
  EXPECT_EQ(parse_error("{}").param, "prompt");
  EXPECT_EQ(parse_error(R"({"prompt":"x","temperature":3})").param, "temperature");
  EXPECT_EQ(parse_error(R"({"prompt":"x","temperature":"hot"})").param, "temperature");
  EXPECT_EQ(parse_error(R"({"prompt":"x","top_p":0})").param, "top_p");
  EXPECT_EQ(parse_error(R"({"prompt":"x","max_tokens":0})").param, "max_tokens");
  EXPECT_EQ(parse_error(R"({"prompt":"x","max_tokens":1e30})").param, "max_tokens");
  EXPECT_EQ(parse_error(R"({"prompt":"x","max_tokens":18446744073709551615})").param, "max_tokens");
  EXPECT_EQ(parse_error(R"({"prompt":"x","n":17})").param, "n");
  EXPECT_EQ(parse_error(R"({"prompt":"x","stop":[1]})").param, "stop");
  EXPECT_EQ(parse_error(R"({"prompt":"x","logprobs":21})").param, "logprobs");
  EXPECT_EQ(parse_error(R"({"prompt":[-1]})").param, "prompt");
  EXPECT_EQ(parse_error(R"({"prompt":{"a":1}})").param, "prompt");
  EXPECT_EQ(parse_error(R"({"prompt":"x","stream_options":{"include_usage":true}})").param, "stream_options");
  EXPECT_EQ(parse_error(R"({"messages":[]})", Endpoint::Chat).param, "messages");
  EXPECT_EQ(parse_error(R"({"messages":[{"role":"wizard","content":"x"}]})", Endpoint::Chat).param, "messages");
  EXPECT_EQ(parse_error(R"({"messages":[{"role":"user","content":"x"}],"reasoning_effort":"huge"})", Endpoint::Chat)
                .param,
            "reasoning_effort");
  EXPECT_EQ(parse_error(R"({"messages":[{"role":"user","content":"x"}],"top_logprobs":2})", Endpoint::Chat).param,
            "top_logprobs");
  EXPECT_EQ(parse_error(R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function"}]})", Endpoint::Chat)
                .param,
            "tools");
  // Deep nesting is refused before anything recurses into it.
  std::string deep = R"({"prompt":"x","extra":)" + std::string(100000, '[') + std::string(100000, ']') + "}";
  EXPECT_NE(parse_error(deep).message.find("nested deeper"), std::string::npos);
  // Random bytes never throw.
  std::string junk;
  for (int i = 0; i < 2000; ++i) {
    junk += char((i * 7919) % 256);
    (void)parse_request(junk, Endpoint::Chat, {});
    (void)parse_tokenize(junk);
    (void)parse_detokenize(junk, 100);
  }
}

TEST(ServeRequest, ChatOptionsAndPromptBudget) {
  ParseResult r = parse_request(
      R"({"messages":[{"role":"user","content":"hi"}],"chat_template_kwargs":{"thinking":true},
          "reasoning_effort":"max","logprobs":true,"top_logprobs":2,"max_completion_tokens":4,
          "tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}]})",
      Endpoint::Chat, {});
  ASSERT_FALSE(r.error) << r.error->message;
  EXPECT_EQ(r.request->mode, chat::Mode::Thinking);
  EXPECT_EQ(r.request->reasoning_effort, "max");
  EXPECT_EQ(r.request->logprobs, 2);
  EXPECT_EQ(*r.request->max_tokens, 4);
  PromptResult p = build_prompt(*r.request, tokenizer(), 4096, {});
  ASSERT_FALSE(p.error) << p.error->message;
  const std::string text = tokenizer().decode(p.prompt->tokens);
  EXPECT_NE(text.find("## Tools"), std::string::npos);  // tools went to a system message
  EXPECT_EQ(text.substr(text.size() - chat::kThinkStart.size()), chat::kThinkStart);
  // reasoning_effort alone turns thinking on; chat_template_kwargs can turn it off.
  EXPECT_EQ(parse_request(R"({"messages":[{"role":"user","content":"x"}],"reasoning_effort":"low"})", Endpoint::Chat, {})
                .request->mode,
            chat::Mode::Thinking);
  // Context: prompt + max_tokens must fit; a missing max_tokens is the rest of the context (chat).
  ParseResult c = parse_request(R"({"prompt":"hello world","max_tokens":100})", Endpoint::Completions, {});
  PromptResult too_long = build_prompt(*c.request, tokenizer(), 50, {});
  ASSERT_TRUE(too_long.error);
  EXPECT_EQ(too_long.error->param, "max_tokens");
  ParseResult ch = parse_request(R"({"messages":[{"role":"user","content":"x"}]})", Endpoint::Chat, {});
  PromptResult rest = build_prompt(*ch.request, tokenizer(), 100, {});
  ASSERT_FALSE(rest.error);
  EXPECT_EQ(rest.prompt->max_tokens, 100 - int64_t(rest.prompt->tokens.size()));
  ParseResult bad_id = parse_request(R"({"prompt":[999999]})", Endpoint::Completions, {});
  EXPECT_TRUE(build_prompt(*bad_id.request, tokenizer(), 100, {}).error);
}

TEST(ServeChatStream, ReasoningApartFromContentAtAnyPieceBoundary) {
  const std::string text = "Let me think about 2+2.</think>The answer is 4.";
  for (size_t cut = 1; cut <= 4; ++cut) {  // pieces of 1..4 bytes split every marker somewhere
    ChatStreamer cs(chat::Mode::Thinking);
    std::string reasoning, content;
    for (size_t i = 0; i < text.size(); i += cut) {
      auto d = cs.push(text.substr(i, cut));
      EXPECT_EQ(d.reasoning.find('<'), std::string::npos);
      EXPECT_EQ(d.content.find('<'), std::string::npos);
      reasoning += d.reasoning;
      content += d.content;
    }
    auto f = cs.finish(true);
    reasoning += f.delta.reasoning;
    content += f.delta.content;
    EXPECT_EQ(reasoning, "Let me think about 2+2.");
    EXPECT_EQ(content, "The answer is 4.");
    EXPECT_EQ(f.reasoning, reasoning);
    EXPECT_EQ(f.content, content);
    EXPECT_TRUE(f.tool_calls.empty());
  }
}

TEST(ServeChatStream, DsmlToolCallsBecomeToolCalls) {
  Json call = {{"type", "function"},
               {"function", {{"name", "get_weather"}, {"arguments", R"({"city": "Paris", "days": 3})"}}}};
  const std::string text =
      model_output({{"role", "assistant"}, {"content", "Let me check."}, {"tool_calls", Json::array({call})}});
  ASSERT_NE(text.find(chat::kDsml), std::string::npos);
  ChatStreamer cs(chat::Mode::Chat);
  std::string content;
  for (size_t i = 0; i < text.size(); i += 3) {
    auto d = cs.push(text.substr(i, 3));
    EXPECT_EQ(d.content.find("DSML"), std::string::npos) << "markup leaked: " << d.content;
    EXPECT_TRUE(d.reasoning.empty());
    content += d.content;
  }
  auto f = cs.finish(true);
  content += f.delta.content;
  EXPECT_EQ(content, "Let me check.");
  ASSERT_EQ(f.tool_calls.size(), 1u);
  EXPECT_EQ(f.tool_calls[0].name, "get_weather");
  EXPECT_EQ(Json::parse(f.tool_calls[0].arguments), Json::parse(R"({"city": "Paris", "days": 3})"));
  // Cut off inside the block (max_tokens): no tool call, and still no markup in the content.
  ChatStreamer cut(chat::Mode::Chat);
  cut.push(text.substr(0, text.size() - 20));
  auto g = cut.finish(false);
  EXPECT_TRUE(g.tool_calls.empty());
  EXPECT_EQ(g.content, "Let me check.");
}

TEST(ServeResponder, ChatStreamAndBodyAgree) {
  ParseResult pr = parse_request(R"({"messages":[{"role":"user","content":"x"}],"stream":true,
                                     "stream_options":{"include_usage":true},"chat_template_kwargs":{"thinking":true}})",
                                 Endpoint::Chat, {});
  ASSERT_FALSE(pr.error);
  ApiRequest req = *pr.request;
  Json call = {{"type", "function"}, {"function", {{"name", "f"}, {"arguments", R"({"x": 1})"}}}};
  const std::string answer = "Hmm.</think>" + model_output({{"role", "assistant"}, {"content", "Ok."},
                                                             {"tool_calls", Json::array({call})}});
  std::vector<JobEvent> events;
  for (size_t i = 0; i < answer.size(); i += 5) events.push_back({JobEvent::Token, answer.substr(i, 5), {{7}}});
  JobEvent fin;
  fin.kind = JobEvent::Finish;
  fin.finish_reason = "stop";
  fin.eos = true;
  fin.prompt_tokens = 11;
  fin.completion_tokens = int64_t(events.size()) + 1;
  events.push_back(fin);

  Responder streamer(req, {"chatcmpl-1", 1, "m"}, tokenizer());
  std::string sse_text = streamer.stream_start();
  for (const auto& e : events) sse_text += streamer.stream(e);
  std::string reasoning, content, finish;
  Json tool_calls, usage;
  size_t pos = 0, n_data = 0;
  while ((pos = sse_text.find("data: ", pos)) != std::string::npos) {
    size_t end = sse_text.find("\n\n", pos);
    std::string data = sse_text.substr(pos + 6, end - pos - 6);
    pos = end;
    ++n_data;
    if (data == "[DONE]") {
      EXPECT_EQ(end + 2, sse_text.size());
      break;
    }
    Json j = Json::parse(data);
    EXPECT_EQ(j["object"], "chat.completion.chunk");
    if (j["choices"].empty()) {
      usage = j["usage"];
      continue;
    }
    const Json& d = j["choices"][0]["delta"];
    if (d.contains("reasoning_content")) reasoning += d["reasoning_content"].get<std::string>();
    if (d.contains("content")) content += d["content"].get<std::string>();
    if (d.contains("tool_calls")) tool_calls = d["tool_calls"];
    if (!j["choices"][0]["finish_reason"].is_null()) finish = j["choices"][0]["finish_reason"];
  }
  EXPECT_GT(n_data, 3u);
  EXPECT_EQ(reasoning, "Hmm.");
  EXPECT_EQ(content, "Ok.");
  EXPECT_EQ(finish, "tool_calls");
  ASSERT_EQ(tool_calls.size(), 1u);
  EXPECT_EQ(tool_calls[0]["function"]["name"], "f");
  EXPECT_EQ(tool_calls[0]["index"], 0);
  EXPECT_EQ(usage["prompt_tokens"], 11);
  EXPECT_EQ(usage["total_tokens"], 11 + fin.completion_tokens);

  req.stream = false;
  Responder whole(req, {"chatcmpl-1", 1, "m"}, tokenizer());
  for (const auto& e : events) whole.consume(e);
  ASSERT_TRUE(whole.done());
  Json body = Json::parse(whole.body());
  EXPECT_EQ(body["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_EQ(body["choices"][0]["message"]["content"], "Ok.");
  EXPECT_EQ(body["choices"][0]["message"]["reasoning_content"], "Hmm.");
  EXPECT_EQ(body["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"], R"({"x": 1})");
}

// ---- The scheduler over a scripted backend ----------------------------------------------------

namespace {
// A ModelBackend double: a slot's "state" is its token list; the logits of a row single out
// a token that is a hash of the slot's whole history, so any mix-up of slots, positions or
// prefix copies changes the output.
class ScriptedBackend : public ModelBackend {
 public:
  static constexpr int32_t kPoison = 3;  // a step holding this token fails (as a non-finite step would)
  explicit ScriptedBackend(int64_t vocab) : vocab_(vocab) {}
  Device device() const override { return Device::CPU; }
  void reserve(const CacheShape& s) override {
    shape_ = s;
    held_.assign(size_t(s.max_slots), {});
  }
  const CacheShape& shape() const override { return shape_; }
  size_t bytes_per_slot(const CacheShape& s) const override { return size_t(s.max_ctx) * 4; }
  int64_t slot_pos(int32_t s) const override { return int64_t(held_.at(size_t(s)).size()); }
  void reset_slot(int32_t s) override { held_.at(size_t(s)).clear(); }
  void copy_slot(int32_t f, int32_t t) override {
    held_.at(size_t(t)) = held_.at(size_t(f));
    ++copies;
  }
  void step(const Batch& b, float* out) override {
    if (b.n > shape_.max_step_tokens) throw Error("step too large");
    for (int32_t i = 0; i < b.n; ++i)
      if (b.token[i] == kPoison) throw Error("poisoned token");  // before any state changes
    max_batch = std::max(max_batch, b.n);
    ++steps;
    size_t row = 0;
    for (int32_t i = 0; i < b.n; ++i) {
      auto& h = held_.at(size_t(b.slot[i]));
      if (b.pos[i] != int32_t(h.size())) throw Error("position does not continue the slot");
      h.push_back(b.token[i]);
      if (!b.logits[i]) continue;
      uint64_t x = 1469598103934665603ull;
      for (int32_t t : h) x = (x ^ uint64_t(t)) * 1099511628211ull;
      float* r = out + row++ * size_t(vocab_);
      for (int64_t v = 0; v < vocab_; ++v) r[v] = float((uint64_t(v) * 2654435761u + x) % 1000) / 1000.f;
      r[int64_t(x % uint64_t(vocab_ - 2)) + 2] = 8.f;  // never EOS (id 1)
    }
  }
  int32_t max_batch = 0;
  int steps = 0, copies = 0;

 private:
  int64_t vocab_;
  CacheShape shape_;
  std::vector<std::vector<int32_t>> held_;
};

std::shared_ptr<Job> make_job(std::vector<int32_t> prompt, int64_t max_tokens, float temperature = 0.f,
                              uint64_t seed = 0) {
  JobSpec s;
  s.id = "t";
  s.prompt = std::move(prompt);
  s.max_tokens = max_tokens;
  s.sampling.temperature = temperature;
  s.sampling.seed = seed;
  s.logprobs = 1;
  return std::make_shared<Job>(std::move(s));
}

// Drains the job's events: the generated ids and the finish event.
std::pair<std::vector<int32_t>, JobEvent> collect(Job& j) {
  std::vector<int32_t> ids;
  for (const JobEvent& e : j.pop(0)) {
    for (const TokenOut& t : e.tokens) ids.push_back(t.id);
    if (e.kind == JobEvent::Finish) return {ids, e};
  }
  return {ids, JobEvent{}};
}

void run_all(Engine& e) {
  for (int i = 0; i < 10000 && e.step_once(); ++i) {
  }
}

std::vector<int32_t> prompt_of(int n, int salt) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back(5 + (i * 31 + salt * 17) % 200);
  return p;
}
}  // namespace

TEST(ServeEngine, SameOutputAloneAndInABatchWithChunkedPrefill) {
  const int64_t V = tokenizer().vocab_size();
  EngineOptions o;
  o.max_seqs = 4;
  o.max_step_tokens = 16;
  o.ctx = 256;
  o.eos_ids = {1};
  // Alone.
  std::vector<std::vector<int32_t>> alone;
  for (int r = 0; r < 10; ++r) {
    ScriptedBackend be(V);
    Engine e(be, &tokenizer(), V, o, nullptr);
    auto j = make_job(prompt_of(20 + r * 7, r), 12, r % 2 ? 0.8f : 0.f, 100 + r);
    e.submit(j);
    run_all(e);
    auto [ids, fin] = collect(*j);
    EXPECT_EQ(fin.finish_reason, "length");
    EXPECT_EQ(fin.completion_tokens, 12);
    alone.push_back(ids);
  }
  // Ten at once on four slots: queueing, chunked prefill, mixed decode + prefill steps.
  ScriptedBackend be(V);
  Metrics m("test");
  Engine e(be, &tokenizer(), V, o, &m);
  std::vector<std::shared_ptr<Job>> jobs;
  for (int r = 0; r < 10; ++r) {
    jobs.push_back(make_job(prompt_of(20 + r * 7, r), 12, r % 2 ? 0.8f : 0.f, 100 + r));
    e.submit(jobs.back());
  }
  run_all(e);
  EXPECT_TRUE(e.idle());
  EXPECT_EQ(be.max_batch, 16);
  for (int r = 0; r < 10; ++r) EXPECT_EQ(collect(*jobs[size_t(r)]).first, alone[size_t(r)]) << "request " << r;
  const std::string text = m.render();
  EXPECT_NE(text.find("clawmine:generation_tokens_total{model_name=\"test\"} 120"), std::string::npos) << text;
  EXPECT_NE(text.find("clawmine:time_to_first_token_seconds_count{model_name=\"test\"} 10"), std::string::npos);
}

TEST(ServeEngine, PrefixReuseAndCancellation) {
  const int64_t V = tokenizer().vocab_size();
  EngineOptions o;
  o.max_seqs = 2;
  o.max_step_tokens = 64;
  o.ctx = 256;
  ScriptedBackend be(V);
  Metrics m("t");
  Engine e(be, &tokenizer(), V, o, &m);
  // Turn 1, then turn 2 whose prompt extends what the slot holds (turn 1 prompt + its output).
  auto t1 = make_job(prompt_of(30, 1), 5);
  e.submit(t1);
  run_all(e);
  auto [out1, f1] = collect(*t1);
  std::vector<int32_t> p2 = prompt_of(30, 1);
  p2.insert(p2.end(), out1.begin(), out1.end());
  p2.push_back(9);
  auto t2 = make_job(p2, 5);
  e.submit(t2);
  run_all(e);
  auto [out2, f2] = collect(*t2);
  EXPECT_EQ(f2.cached_tokens, 34);  // 30 prompt + 4 fed outputs (the last output is never fed)
  // The same request on a fresh engine (no reuse) gives the same tokens.
  ScriptedBackend be2(V);
  Engine e2(be2, &tokenizer(), V, o, nullptr);
  auto t2b = make_job(p2, 5);
  e2.submit(t2b);
  run_all(e2);
  EXPECT_EQ(collect(*t2b).first, out2);
  EXPECT_NE(m.render().find("clawmine:prefix_cache_hits_total{model_name=\"t\"} 34"), std::string::npos);

  // A busy slot holding a prefix is copied, not shared.
  auto a = make_job(prompt_of(40, 3), 50);
  e.submit(a);
  e.step_once();  // a's prompt is in its slot now
  std::vector<int32_t> pb = prompt_of(40, 3);
  pb.push_back(11);
  auto b = make_job(pb, 3);
  e.submit(b);
  e.step_once();
  EXPECT_EQ(be.copies, 1);
  // Cancel a: its slot is free at the next step.
  a->cancelled = true;
  run_all(e);
  EXPECT_TRUE(e.idle());
  EXPECT_EQ(collect(*a).second.finish_reason, "cancelled");
  JobEvent fb = collect(*b).second;
  EXPECT_EQ(fb.finish_reason, "length");
  EXPECT_EQ(fb.cached_tokens, 40);
}

TEST(ServeEngine, StopStringsAndLogprobs) {
  const int64_t V = tokenizer().vocab_size();
  EngineOptions o;
  o.max_seqs = 1;
  o.max_step_tokens = 64;
  o.ctx = 64;
  ScriptedBackend be(V);
  Engine e(be, &tokenizer(), V, o, nullptr);
  auto j = make_job(prompt_of(10, 2), 20);
  e.submit(j);
  run_all(e);
  std::string text;
  std::vector<int32_t> ids;
  for (const JobEvent& ev : j->pop(0)) {
    text += ev.text;
    for (const TokenOut& t : ev.tokens) {
      ids.push_back(t.id);
      EXPECT_LE(t.logprob, 0.f);
      ASSERT_EQ(t.top.size(), 1u);
      EXPECT_EQ(t.top[0].id, t.id);  // greedy: the chosen token is the most likely
    }
  }
  ASSERT_EQ(ids.size(), 20u);
  StreamDecoder sd(tokenizer());
  std::string want;
  for (int32_t id : ids) want += sd.push(id);
  EXPECT_EQ(text, want + sd.flush());
  // Stop at a string from the middle of that text: output is what precedes it.
  const std::string stop = text.substr(text.size() / 2, 3);
  ScriptedBackend be2(V);
  Engine e2(be2, &tokenizer(), V, o, nullptr);
  JobSpec s = j->spec;
  s.stop = {stop};
  auto js = std::make_shared<Job>(s);
  e2.submit(js);
  run_all(e2);
  std::string got;
  JobEvent fin;
  for (const JobEvent& ev : js->pop(0)) {
    got += ev.text;
    if (ev.kind == JobEvent::Finish) fin = ev;
  }
  EXPECT_EQ(fin.finish_reason, "stop");
  EXPECT_EQ(got, text.substr(0, text.find(stop)));
  // The context limit ends a sequence with "length".
  ScriptedBackend be3(V);
  Engine e3(be3, &tokenizer(), V, o, nullptr);
  auto jl = make_job(prompt_of(60, 2), 100);
  e3.submit(jl);
  run_all(e3);
  auto [lids, lfin] = collect(*jl);
  EXPECT_EQ(lfin.finish_reason, "length");
  EXPECT_EQ(lids.size(), 5u);  // positions 60..63 fed, the 5th token is never fed
}

TEST(ServeEngine, AFailingSequenceEndsAloneTheOthersContinue) {
  const int64_t V = tokenizer().vocab_size();
  EngineOptions o;
  o.max_seqs = 3;
  o.max_step_tokens = 64;
  o.ctx = 128;
  ScriptedBackend lone_be(V);
  Engine lone(lone_be, &tokenizer(), V, o, nullptr);
  auto ref = make_job(prompt_of(12, 4), 8);
  lone.submit(ref);
  run_all(lone);
  const std::vector<int32_t> want = collect(*ref).first;

  ScriptedBackend be(V);
  Engine e(be, &tokenizer(), V, o, nullptr);
  std::vector<int32_t> poisoned = prompt_of(12, 5);
  poisoned[6] = ScriptedBackend::kPoison;
  auto bad = make_job(poisoned, 8);
  auto good = make_job(prompt_of(12, 4), 8);
  e.submit(good);
  e.submit(bad);
  run_all(e);
  auto [bad_ids, bad_fin] = collect(*bad);
  EXPECT_EQ(bad_fin.finish_reason, "error");
  EXPECT_EQ(bad_fin.error, "poisoned token");
  EXPECT_TRUE(bad_ids.empty());
  auto [good_ids, good_fin] = collect(*good);
  EXPECT_EQ(good_fin.finish_reason, "length");
  EXPECT_EQ(good_ids, want);
  EXPECT_TRUE(e.idle());
}

// Engine steps on /metrics: the count, the rows, and the seconds of each part summed.
TEST(ServeMetrics, EngineStepParts) {
  Metrics m("s");
  m.engine_step(64, 0.25, 0.125, 0.0625);  // binary fractions: the sums print exactly
  m.engine_step(192, 0.5, 0.25, 0.125);
  const std::string t = m.render();
  EXPECT_NE(t.find("clawmine:engine_steps_total{model_name=\"s\"} 2\n"), std::string::npos) << t;
  EXPECT_NE(t.find("clawmine:engine_step_tokens_total{model_name=\"s\"} 256\n"), std::string::npos) << t;
  EXPECT_NE(t.find("clawmine:engine_step_seconds_total{model_name=\"s\",part=\"backend\"} 0.75\n"), std::string::npos) << t;
  EXPECT_NE(t.find("clawmine:engine_step_seconds_total{model_name=\"s\",part=\"sample\"} 0.375\n"), std::string::npos) << t;
  EXPECT_NE(t.find("clawmine:engine_step_seconds_total{model_name=\"s\",part=\"engine\"} 0.1875\n"), std::string::npos) << t;
}

// MTP's counters on /metrics (vLLM's spec_decode names): rounds, draft tokens, accepted, by position.
TEST(ServeMetrics, SpecDecodeCounters) {
  Metrics m("s");
  m.spec_decode(3, 2);
  m.spec_decode(3, 0);
  m.spec_decode(2, 1);
  const std::string t = m.render();
  const std::string l = "{model_name=\"s\"}";
  EXPECT_NE(t.find("clawmine:spec_decode_num_drafts_total" + l + " 3\n"), std::string::npos) << t;
  EXPECT_NE(t.find("clawmine:spec_decode_num_draft_tokens_total" + l + " 8\n"), std::string::npos) << t;
  EXPECT_NE(t.find("clawmine:spec_decode_num_accepted_tokens_total" + l + " 3\n"), std::string::npos) << t;
  const std::string pos = "clawmine:spec_decode_num_accepted_tokens_per_pos_total{model_name=\"s\",position=";
  EXPECT_NE(t.find(pos + "\"0\"} 2\n"), std::string::npos) << t;
  EXPECT_NE(t.find(pos + "\"1\"} 1\n"), std::string::npos) << t;
  EXPECT_NE(t.find(pos + "\"2\"} 0\n"), std::string::npos) << t;
}
