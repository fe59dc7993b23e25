// The request fields that make several choices or change sampling: logit_bias, n, best_of, echo
// and prompt lists (parsing, validation naming the field, build_prompts), the per-choice seeds
// and forks of make_jobs, and ChoiceSet's merged responses on scripted events (choices indexed
// prompt × n + k, best_of keeping the highest cumulative logprob, usage counting each prompt once,
// streamed chunks per index, echo with prompt logprobs).
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cmath>
#include <map>
#include <set>

#include "serve/choices.h"
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

ApiRequest parse_ok(const std::string& body, Endpoint ep = Endpoint::Completions) {
  ParseResult r = parse_request(body, ep, {});
  EXPECT_FALSE(r.error) << body << ": " << (r.error ? r.error->message : "");
  return r.request.value_or(ApiRequest{});
}

std::string param_of(const std::string& body, Endpoint ep = Endpoint::Completions) {
  ParseResult r = parse_request(body, ep, {});
  EXPECT_TRUE(r.error) << body;
  EXPECT_EQ(r.error.value_or(ApiError{}).status, 400);
  return r.error.value_or(ApiError{}).param;
}

JobEvent token(const std::string& text, int32_t id, float logprob) {
  JobEvent e;
  e.text = text;
  e.tokens.push_back(TokenOut{id, logprob, {}});
  return e;
}

JobEvent finish(int64_t prompt, int64_t completion, int64_t cached = 0) {
  JobEvent e;
  e.kind = JobEvent::Finish;
  e.finish_reason = "length";
  e.prompt_tokens = prompt;
  e.completion_tokens = completion;
  e.cached_tokens = cached;
  return e;
}

std::vector<std::shared_ptr<Job>> jobs_of(size_t n) {
  std::vector<std::shared_ptr<Job>> j;
  for (size_t i = 0; i < n; ++i) j.push_back(std::make_shared<Job>(JobSpec{}));
  return j;
}

// The data lines of an SSE text, parsed ("[DONE]" as the string).
std::vector<Json> sse_data(const std::string& text) {
  std::vector<Json> out;
  size_t pos = 0;
  while ((pos = text.find("data: ", pos)) != std::string::npos) {
    const size_t end = text.find("\n\n", pos);
    const std::string d = text.substr(pos + 6, end - pos - 6);
    out.push_back(d == "[DONE]" ? Json(d) : Json::parse(d));
    pos = end;
  }
  return out;
}
}  // namespace

TEST(RequestFields, LogitBiasParsedAndValidated) {
  ApiRequest r = parse_ok(R"({"prompt":"x","logit_bias":{"5":-100,"17":2.5}})");
  ASSERT_EQ(r.sampling.logit_bias.size(), 2u);
  EXPECT_EQ(r.sampling.logit_bias[0], (std::pair<int32_t, float>{5, -100.0f}));
  EXPECT_EQ(r.sampling.logit_bias[1], (std::pair<int32_t, float>{17, 2.5f}));
  EXPECT_EQ(parse_ok(R"({"messages":[{"role":"user","content":"x"}],"logit_bias":{"3":1}})", Endpoint::Chat)
                .sampling.logit_bias.size(),
            1u);
  for (const char* bad : {R"({"prompt":"x","logit_bias":{"a":1}})", R"({"prompt":"x","logit_bias":{"-1":1}})",
                          R"({"prompt":"x","logit_bias":{"1.5":1}})", R"({"prompt":"x","logit_bias":{"":1}})",
                          R"({"prompt":"x","logit_bias":{"99999999999":1}})",
                          R"({"prompt":"x","logit_bias":{"1":101}})", R"({"prompt":"x","logit_bias":{"1":-100.5}})",
                          R"({"prompt":"x","logit_bias":{"1":"big"}})", R"({"prompt":"x","logit_bias":[1]})"})
    EXPECT_EQ(param_of(bad), "logit_bias") << bad;
  // Ids beyond the vocabulary are refused once the tokenizer is known.
  ApiRequest far = parse_ok(fmt::format(R"({{"prompt":"x","logit_bias":{{"{}":1}}}})", tokenizer().vocab_size()));
  PromptsResult p = build_prompts(far, tokenizer(), 4096, {});
  ASSERT_TRUE(p.error);
  EXPECT_EQ(p.error->param, "logit_bias");
}

TEST(RequestFields, NBestOfAndEcho) {
  ApiRequest r = parse_ok(R"({"prompt":"x","n":3})");
  EXPECT_EQ(r.n, 3);
  EXPECT_EQ(r.best_of, 3);
  r = parse_ok(R"({"prompt":"x","n":2,"best_of":5,"echo":true})");
  EXPECT_EQ(r.best_of, 5);
  EXPECT_TRUE(r.echo);
  EXPECT_EQ(parse_ok(R"({"prompt":"x","n":2,"best_of":2,"stream":true})").n, 2);
  EXPECT_EQ(param_of(R"({"prompt":"x","n":0})"), "n");
  EXPECT_EQ(param_of(R"({"prompt":"x","n":17})"), "n");
  EXPECT_EQ(param_of(R"({"prompt":"x","n":3,"best_of":2})"), "best_of");
  EXPECT_EQ(param_of(R"({"prompt":"x","best_of":3,"stream":true})"), "best_of");
  EXPECT_EQ(param_of(R"({"prompt":"x","echo":"yes"})"), "echo");
  EXPECT_EQ(param_of(R"({"prompt":["a","b","c","d","e"],"n":16})"), "n");  // 80 sequences
}

TEST(RequestFields, PromptLists) {
  ApiRequest r = parse_ok(R"({"prompt":["Hello there","General Kenobi"]})");
  ASSERT_EQ(r.prompts.size(), 2u);
  EXPECT_EQ(r.prompts[1].text, "General Kenobi");
  EXPECT_EQ(r.prompt_text, "Hello there");
  r = parse_ok(R"({"prompt":[[1,2,3],[4,5]]})");
  ASSERT_EQ(r.prompts.size(), 2u);
  EXPECT_EQ(r.prompts[1].tokens, (std::vector<int32_t>{4, 5}));
  r = parse_ok(R"({"prompt":[1,2,3]})");  // one token prompt
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_EQ(r.prompt_tokens, (std::vector<int32_t>{1, 2, 3}));
  r = parse_ok(R"({"prompt":["one"]})");
  ASSERT_EQ(r.prompts.size(), 1u);
  for (const char* bad : {R"({"prompt":[]})", R"({"prompt":["a",1]})", R"({"prompt":[[1],2]})",
                          R"({"prompt":[[]]})", R"({"prompt":[[1,-2]]})", R"({"prompt":[{"x":1}]})"})
    EXPECT_EQ(param_of(bad), "prompt") << bad;

  r = parse_ok(R"({"prompt":["Hello there",[3,4,5]],"max_tokens":7})");
  PromptsResult p = build_prompts(r, tokenizer(), 4096, {});
  ASSERT_FALSE(p.error);
  ASSERT_EQ(p.prompts.size(), 2u);
  EXPECT_EQ(p.prompts[0].tokens, tokenizer().encode("Hello there"));
  EXPECT_EQ(p.prompts[1].tokens, (std::vector<int32_t>{3, 4, 5}));
  EXPECT_EQ(p.prompts[1].max_tokens, 7);
  r = parse_ok(fmt::format(R"({{"prompt":["ok",[{}]]}})", tokenizer().vocab_size()));
  p = build_prompts(r, tokenizer(), 4096, {});
  ASSERT_TRUE(p.error);
  EXPECT_EQ(p.error->param, "prompt");
}

TEST(RequestFields, JobsSeedsAndForks) {
  EXPECT_EQ(choice_seed(42, 0), 42u);
  std::set<uint64_t> seeds;
  for (int i = 0; i < 64; ++i) seeds.insert(choice_seed(42, i));
  EXPECT_EQ(seeds.size(), 64u);
  EXPECT_EQ(choice_seed(42, 3), choice_seed(42, 3));
  EXPECT_NE(choice_seed(42, 3), choice_seed(43, 3));

  ApiRequest r = parse_ok(R"({"prompt":["a","b"],"n":2,"best_of":3,"seed":42})");
  JobSpec base;
  base.id = "cmpl-x";
  auto jobs = make_jobs(r, base, {{1, 2}, {3}}, {5, 6}, [] { return uint64_t(7); });
  ASSERT_EQ(jobs.size(), 6u);
  for (size_t i = 0; i < 6; ++i) {
    const JobSpec& s = jobs[i]->spec;
    EXPECT_EQ(s.id, "cmpl-x-" + std::to_string(i));
    EXPECT_EQ(s.sampling.seed, choice_seed(42, int64_t(i)));
    EXPECT_EQ(s.prompt, (i < 3 ? std::vector<int32_t>{1, 2} : std::vector<int32_t>{3}));
    EXPECT_EQ(s.max_tokens, i < 3 ? 5 : 6);
    EXPECT_EQ(s.logprobs, 0);  // best_of > n ranks by logprob
    EXPECT_EQ(s.forks, i % 3 == 0 ? 2 : 0);
    EXPECT_EQ(s.fork_of, i % 3 == 0 ? nullptr : jobs[i / 3 * 3]);
  }
  // No seed: each job its own random one; echo + logprobs: no forks (each computes prompt logprobs).
  r = parse_ok(R"({"prompt":"a","n":2,"echo":true,"logprobs":1})");
  uint64_t next = 100;
  base.logprobs = r.logprobs;
  jobs = make_jobs(r, base, {{1}}, {4}, [&] { return next++; });
  ASSERT_EQ(jobs.size(), 2u);
  EXPECT_EQ(jobs[0]->spec.sampling.seed, 100u);
  EXPECT_EQ(jobs[1]->spec.sampling.seed, 101u);
  EXPECT_EQ(jobs[0]->spec.id, "cmpl-x-0");
  for (auto& j : jobs) {
    EXPECT_TRUE(j->spec.prompt_logprobs);
    EXPECT_EQ(j->spec.forks, 0);
    EXPECT_EQ(j->spec.fork_of, nullptr);
    EXPECT_EQ(j->spec.logprobs, 1);
  }
  jobs = make_jobs(parse_ok(R"({"prompt":"a"})"), base, {{1}}, {4}, [] { return uint64_t(9); });
  ASSERT_EQ(jobs.size(), 1u);
  EXPECT_EQ(jobs[0]->spec.id, "cmpl-x");
  EXPECT_EQ(jobs[0]->spec.forks, 0);
}

// best_of 3, n 2 over two prompts: each prompt keeps its two candidates of highest cumulative
// logprob, best first; usage counts each prompt once and every candidate's tokens.
TEST(RequestFields, ChoiceSetKeepsTheBestAndSumsUsage) {
  ApiRequest r = parse_ok(R"({"prompt":["p","q"],"n":2,"best_of":3})");
  auto jobs = jobs_of(6);
  const float lp[6] = {-3.0f, -1.0f, -2.0f, -0.5f, -0.5f, -4.0f};
  for (size_t i = 0; i < 6; ++i) {
    jobs[i]->push(token("t" + std::to_string(i), int32_t(i), lp[i]));
    jobs[i]->push(finish(i < 3 ? 4 : 5, 1, i % 3 == 0 ? 0 : 3));
  }
  ChoiceSet cs(r, {"cmpl-1", 1, "m"}, tokenizer(), jobs, {});
  for (int k = 0; k < 10 && !cs.done(); ++k) cs.consume(0);
  ASSERT_TRUE(cs.done());
  ASSERT_FALSE(cs.failed());
  Json b = Json::parse(cs.body());
  ASSERT_EQ(b["choices"].size(), 4u);
  std::vector<std::string> texts;
  for (size_t k = 0; k < 4; ++k) {
    EXPECT_EQ(b["choices"][k]["index"], k);
    EXPECT_TRUE(b["choices"][k]["logprobs"].is_null());  // ranking asked for logprobs; the client did not
    texts.push_back(b["choices"][k]["text"]);
  }
  EXPECT_EQ(texts, (std::vector<std::string>{"t1", "t2", "t3", "t4"}));
  EXPECT_EQ(b["usage"]["prompt_tokens"], 9);
  EXPECT_EQ(b["usage"]["completion_tokens"], 6);
  EXPECT_EQ(b["usage"]["total_tokens"], 15);
  EXPECT_EQ(b["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
}

// Streaming n = 2: chunks of both indices, each choice's finish, then one usage chunk and [DONE].
TEST(RequestFields, ChoiceSetStreamsEveryIndex) {
  ApiRequest r = parse_ok(R"({"prompt":"p","n":2,"stream":true,"stream_options":{"include_usage":true}})");
  auto jobs = jobs_of(2);
  ChoiceSet cs(r, {"cmpl-1", 1, "m"}, tokenizer(), jobs, {});
  std::string text = cs.stream_start();
  jobs[1]->push(token("b", 2, -1));
  jobs[0]->push(token("a", 1, -1));
  text += cs.stream(0);
  jobs[0]->push(finish(3, 1));
  text += cs.stream(0);
  EXPECT_FALSE(cs.done());
  jobs[1]->push(token("c", 3, -1));
  jobs[1]->push(finish(3, 2));
  text += cs.stream(0);
  EXPECT_TRUE(cs.done());
  std::vector<Json> d = sse_data(text);
  ASSERT_FALSE(d.empty());
  EXPECT_EQ(d.back(), "[DONE]");
  std::map<int, std::string> by_index;
  std::map<int, std::string> finish_of;
  Json usage;
  for (const Json& j : d) {
    if (j.is_string()) continue;
    if (j["choices"].empty()) {
      usage = j["usage"];
      continue;
    }
    const Json& c = j["choices"][0];
    by_index[c["index"].get<int>()] += c["text"].get<std::string>();
    if (!c["finish_reason"].is_null()) finish_of[c["index"].get<int>()] = c["finish_reason"];
  }
  EXPECT_EQ(by_index[0], "a");
  EXPECT_EQ(by_index[1], "bc");
  EXPECT_EQ(finish_of[0], "length");
  EXPECT_EQ(finish_of[1], "length");
  EXPECT_EQ(usage["prompt_tokens"], 3);
  EXPECT_EQ(usage["completion_tokens"], 3);
  EXPECT_EQ(text.find("[DONE]"), text.rfind("[DONE]"));
}

// echo: the prompt text leads the text; with logprobs the prompt tokens lead the logprobs, the
// first with null, offsets counting from the prompt's start.
TEST(RequestFields, EchoPrependsPromptAndItsLogprobs) {
  ApiRequest r = parse_ok(R"({"prompt":"Hi there","echo":true,"logprobs":1})");
  const std::vector<int32_t> ids = tokenizer().encode("Hi there");
  ASSERT_GE(ids.size(), 2u);
  auto jobs = jobs_of(1);
  JobEvent first = token("!", ids[0], -0.25f);
  for (size_t i = 0; i < ids.size(); ++i)
    first.prompt_logprobs.push_back(TokenOut{ids[i], i == 0 ? NAN : -1.5f, {}});
  for (size_t i = 1; i < ids.size(); ++i) first.prompt_logprobs[i].top.push_back({ids[i], -1.5f});
  first.tokens[0].top.push_back({ids[0], -0.25f});
  jobs[0]->push(first);
  jobs[0]->push(finish(int64_t(ids.size()), 1));
  ChoiceSet cs(r, {"cmpl-1", 1, "m"}, tokenizer(), jobs, {"Hi there"});
  for (int k = 0; k < 5 && !cs.done(); ++k) cs.consume(0);
  ASSERT_TRUE(cs.done());
  Json c = Json::parse(cs.body())["choices"][0];
  EXPECT_EQ(c["text"], "Hi there!");
  const Json& lp = c["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), ids.size() + 1);
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  EXPECT_TRUE(lp["top_logprobs"][0].is_null());
  EXPECT_EQ(lp["token_logprobs"][1], -1.5);
  EXPECT_EQ(lp["token_logprobs"][ids.size()], -0.25);
  EXPECT_EQ(lp["text_offset"][0], 0);
  EXPECT_EQ(lp["text_offset"][ids.size()], 8);  // "!" after the 8 bytes of the prompt
  std::string joined;
  for (size_t i = 0; i < ids.size(); ++i) joined += lp["tokens"][i].get<std::string>();
  EXPECT_EQ(joined, "Hi there");

  // Streamed: the first chunk carries the prompt and the first token's text.
  ApiRequest rs = parse_ok(R"({"prompt":"Hi there","echo":true,"stream":true})");
  auto sj = jobs_of(1);
  sj[0]->push(token("!", ids[0], -0.25f));
  sj[0]->push(finish(int64_t(ids.size()), 1));
  ChoiceSet ss(rs, {"cmpl-1", 1, "m"}, tokenizer(), sj, {"Hi there"});
  std::string text = ss.stream_start();
  for (int k = 0; k < 5 && !ss.done(); ++k) text += ss.stream(0);
  std::vector<Json> d = sse_data(text);
  ASSERT_GE(d.size(), 2u);
  EXPECT_EQ(d[0]["choices"][0]["text"], "Hi there!");
  EXPECT_EQ(d.back(), "[DONE]");
}
