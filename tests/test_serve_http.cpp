// The server's HTTP policies without a socket (serve/http_policy.h): CORS origin matching for
// --allowed-origins and which request Content-Types a JSON endpoint reads. The same behaviour
// over HTTP is tested by tests/server_test.py (test_cors_*, test_form_encoded_*). Also the
// wording clients match on: the context-overflow message and the reasoning field names.
#include <gtest/gtest.h>

#include "common/error.h"
#include "serve/http_policy.h"
#include "serve/openai.h"
#include "tokenizer/tokenizer.h"

using namespace cm::serve;
using Json = nlohmann::ordered_json;

namespace {
const cm::Tokenizer& tokenizer() {
  static cm::Tokenizer t = cm::Tokenizer::load(std::string(CLAWMINE_TEST_DATA) + "/tokenizer");
  return t;
}
bool has(const std::string& hay, const std::string& needle) { return hay.find(needle) != std::string::npos; }
}  // namespace

TEST(ServeHttpPolicy, AllowedOriginsFlag) {
  EXPECT_TRUE(parse_allowed_origins("").empty());
  EXPECT_TRUE(parse_allowed_origins("  ").empty());
  EXPECT_EQ(parse_allowed_origins("*"), std::vector<std::string>{"*"});
  EXPECT_EQ(parse_allowed_origins("http://a.example, https://b.example:8443/"),
            (std::vector<std::string>{"http://a.example", "https://b.example:8443"}));
  EXPECT_THROW(parse_allowed_origins("http://a.example,,http://b"), cm::Error);
  EXPECT_THROW(parse_allowed_origins("*,http://a.example"), cm::Error);
}

TEST(ServeHttpPolicy, CorsAllowOrigin) {
  const auto off = parse_allowed_origins("");
  EXPECT_EQ(cors_allow_origin(off, "http://a.example"), "");  // off by default: no CORS headers
  const auto any = parse_allowed_origins("*");
  EXPECT_EQ(cors_allow_origin(any, "http://a.example"), "*");
  EXPECT_EQ(cors_allow_origin(any, ""), "");  // not a cross-origin request
  const auto listed = parse_allowed_origins("http://a.example,http://localhost:3000");
  EXPECT_EQ(cors_allow_origin(listed, "http://localhost:3000"), "http://localhost:3000");
  EXPECT_EQ(cors_allow_origin(listed, "HTTP://A.example"), "HTTP://A.example");
  EXPECT_EQ(cors_allow_origin(listed, "http://localhost:3001"), "");
  EXPECT_EQ(cors_allow_origin(listed, "http://evil.example"), "");
}

TEST(ServeHttpPolicy, BodyContentTypes) {
  EXPECT_FALSE(check_body_type("", "{}"));
  EXPECT_FALSE(check_body_type("application/json", "{}"));
  EXPECT_FALSE(check_body_type("Application/JSON; charset=utf-8", "{}"));
  EXPECT_FALSE(check_body_type("application/vnd.api+json", "{}"));
  // curl -d sends JSON bytes as a form: read as JSON, whatever their size.
  const std::string big = "{\"prompt\":\"" + std::string(30000, 'x') + "\"}";
  EXPECT_FALSE(check_body_type("application/x-www-form-urlencoded", big));
  auto form = check_body_type("application/x-www-form-urlencoded", "a=b&c=d");
  ASSERT_TRUE(form);
  EXPECT_EQ(form->status, 415);
  EXPECT_NE(form->message.find("Content-Type: application/json"), std::string::npos) << form->message;
  auto text = check_body_type("text/plain", "{}");
  ASSERT_TRUE(text);
  EXPECT_EQ(text->status, 415);
  EXPECT_NE(text->message.find("'text/plain'"), std::string::npos) << text->message;
  EXPECT_TRUE(check_body_type("multipart/form-data; boundary=x", ""));
}

TEST(ServeWording, ContextOverflowSaysMaximumContextLength) {
  ParseResult c = parse_request(R"({"prompt":"hello world","max_tokens":100})", Endpoint::Completions, {});
  ASSERT_TRUE(c.request);
  PromptResult budget = build_prompt(*c.request, tokenizer(), 50, {});
  ASSERT_TRUE(budget.error);
  EXPECT_EQ(budget.error->param, "max_tokens");
  EXPECT_TRUE(has(budget.error->message, "This model's maximum context length is 50 tokens.")) << budget.error->message;
  EXPECT_TRUE(has(budget.error->message, "in the completion")) << budget.error->message;
  ParseResult big = parse_request(R"({"prompt":"hello world hello world hello world"})", Endpoint::Completions, {});
  PromptResult prompt = build_prompt(*big.request, tokenizer(), 3, {});
  ASSERT_TRUE(prompt.error);
  EXPECT_EQ(prompt.error->param, "prompt");
  EXPECT_TRUE(has(prompt.error->message, "This model's maximum context length is 3 tokens.")) << prompt.error->message;
}

TEST(ServeWording, ReasoningUnderBothNames) {
  for (bool stream : {false, true}) {
    ParseResult pr = parse_request(
        stream ? R"({"messages":[{"role":"user","content":"x"}],"stream":true,"reasoning_effort":"high"})"
               : R"({"messages":[{"role":"user","content":"x"}],"reasoning_effort":"high"})",
        Endpoint::Chat, {});
    ASSERT_TRUE(pr.request);
    Responder r(*pr.request, {"chatcmpl-1", 1, "m"}, tokenizer());
    JobEvent tok{JobEvent::Token, "Let me think.</think>Blue.", {{7}}};
    JobEvent fin;
    fin.kind = JobEvent::Finish;
    fin.finish_reason = "stop";
    fin.eos = true;
    if (stream) {
      std::string sse_text = r.stream_start() + r.stream(tok) + r.stream(fin);
      EXPECT_TRUE(has(sse_text, R"("reasoning_content":"Let me think.")")) << sse_text;
      EXPECT_TRUE(has(sse_text, R"("reasoning":"Let me think.")")) << sse_text;
    } else {
      r.consume(tok);
      r.consume(fin);
      Json msg = Json::parse(r.body())["choices"][0]["message"];
      EXPECT_EQ(msg["reasoning_content"], "Let me think.");
      EXPECT_EQ(msg["reasoning"], "Let me think.");
      EXPECT_EQ(msg["content"], "Blue.");
    }
  }
}

TEST(ServeWording, TokenizeMessagesRenderLikeChat) {
  const std::string body =
      R"({"messages":[{"role":"user","content":"hi"}],"chat_template_kwargs":{"thinking":true},
          "tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}]})";
  TokenizeParse t = parse_tokenize(body);
  ASSERT_TRUE(t.request && t.request->chat) << (t.error ? t.error->message : "");
  ParseResult chat = parse_request(body, Endpoint::Chat, {});
  ASSERT_TRUE(chat.request);
  const std::string text = render_chat(*t.request->chat);
  EXPECT_EQ(text, render_chat(*chat.request));
  EXPECT_TRUE(has(text, "## Tools")) << text;
  EXPECT_EQ(tokenizer().encode(text), build_prompt(*chat.request, tokenizer(), 4096, {}).prompt->tokens);
  EXPECT_TRUE(parse_tokenize(R"({"messages":[{"role":"user","content":"x"}],"tool_choice":"bogus"})").error);
}

TEST(ServeWording, UnknownFieldsListedUserAccepted) {
  ParseResult r = parse_request(R"({"prompt":"x","user":"u1","foo":1,"logit_bias":{},"stop_token_ids":[],
                                     "min_tokens":0,"bar":2})", Endpoint::Completions, {});
  ASSERT_TRUE(r.request);
  EXPECT_EQ(r.request->unknown_fields, (std::vector<std::string>{"foo", "bar"}));
  // A field of the other endpoint is unknown here.
  ParseResult c = parse_request(R"({"messages":[{"role":"user","content":"x"}],"prompt":"y","tools":[]})",
                                Endpoint::Chat, {});
  ASSERT_TRUE(c.request);
  EXPECT_EQ(c.request->unknown_fields, std::vector<std::string>{"prompt"});
}
