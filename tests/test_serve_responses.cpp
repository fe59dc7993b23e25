// POST /v1/responses without a server: the translation of a Responses request onto the chat
// path (input items, instructions, tools, tool_choice, text.format, reasoning, errors naming the
// Responses field) and the response object and event stream of ResponsesResponder on scripted
// model outputs (reasoning, text, tool calls, max_output_tokens, engine errors). The real model
// behind HTTP, through the official `openai` client, is tested in tests/server_test.py.
#include <gtest/gtest.h>

#include <algorithm>

#include "chat/dsv4.h"
#include "serve/responses.h"
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

ResponsesRequest parse_ok(const std::string& body) {
  ResponsesParse p = parse_responses_request(body, {});
  EXPECT_FALSE(p.error) << body << ": " << (p.error ? p.error->message : "");
  return p.request.value_or(ResponsesRequest{});
}

ApiError parse_bad(const std::string& body) {
  ResponsesParse p = parse_responses_request(body, {});
  EXPECT_TRUE(p.error) << body;
  return p.error.value_or(ApiError{});
}

// The chat body a client would send for the same conversation renders the same prompt.
std::string chat_prompt(const std::string& chat_body) {
  ParseResult p = parse_request(chat_body, Endpoint::Chat, {});
  EXPECT_FALSE(p.error) << chat_body;
  return render_chat(*p.request);
}

std::vector<JobEvent> scripted(const std::string& text, const std::string& finish_reason, bool eos, size_t piece = 4) {
  std::vector<JobEvent> ev;
  for (size_t i = 0; i < text.size(); i += piece) ev.push_back({JobEvent::Token, text.substr(i, piece), {{7}}});
  JobEvent fin;
  fin.kind = JobEvent::Finish;
  fin.finish_reason = finish_reason;
  fin.eos = eos;
  fin.prompt_tokens = 20;
  fin.cached_tokens = 3;
  fin.completion_tokens = int64_t(ev.size()) + (eos ? 1 : 0);
  ev.push_back(fin);
  return ev;
}

// What a DeepSeek-V4 model writes for an assistant message (the encoder's rendering of it,
// without the final EOS).
std::string model_output(const Json& assistant) {
  Json msgs = Json::array({{{"role", "user"}, {"content", "q"}}, assistant});
  std::string full = chat::encode_messages(msgs, {chat::Mode::Chat, true, true, ""});
  std::string out = full.substr(full.rfind(chat::kThinkEnd) + chat::kThinkEnd.size());
  return out.substr(0, out.size() - chat::kEos.size());
}

struct Sse {
  std::string type;
  Json data;
};
std::vector<Sse> parse_sse(const std::string& text) {
  std::vector<Sse> out;
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t end = text.find("\n\n", pos);
    EXPECT_NE(end, std::string::npos);
    const std::string block = text.substr(pos, end - pos);
    pos = end + 2;
    EXPECT_EQ(block.rfind("event: ", 0), 0u) << block;
    const size_t nl = block.find('\n');
    EXPECT_EQ(block.compare(nl + 1, 6, "data: "), 0) << block;
    out.push_back({block.substr(7, nl - 7), Json::parse(block.substr(nl + 7))});
  }
  return out;
}

// Runs one request's events through a streaming and a plain responder.
struct Outcome {
  std::vector<Sse> events;
  Json body;
};
Outcome run(const ResponsesRequest& req, const std::vector<JobEvent>& events) {
  ResponsesResponder streamer(req, {"resp_00ab", 1700000000, "default"}, tokenizer());
  std::string text = streamer.stream_start();
  for (const JobEvent& e : events) text += streamer.stream(e);
  EXPECT_TRUE(streamer.done());
  ResponsesResponder plain(req, {"resp_00ab", 1700000000, "default"}, tokenizer());
  for (const JobEvent& e : events) plain.consume(e);
  EXPECT_TRUE(plain.done());
  return {parse_sse(text), Json::parse(plain.body())};
}

std::vector<std::string> types(const std::vector<Sse>& ev) {
  std::vector<std::string> t;
  for (const Sse& e : ev) t.push_back(e.type);
  return t;
}
}  // namespace

TEST(ServeResponsesRequest, StringInputAndInstructionsAreTheChatMessages) {
  ResponsesRequest r = parse_ok(R"({"model":"default","input":"Name a colour.","instructions":"Be brief.",
                                    "max_output_tokens":7,"temperature":0,"top_p":0.5,"seed":3,"stream":true,
                                    "user":"u","store":true,"metadata":{"k":"v"}})");
  EXPECT_EQ(r.chat.endpoint, Endpoint::Chat);
  EXPECT_EQ(r.chat.model, "default");
  EXPECT_EQ(*r.chat.max_tokens, 7);
  EXPECT_FLOAT_EQ(r.chat.sampling.temperature, 0.0f);
  EXPECT_FLOAT_EQ(r.chat.sampling.top_p, 0.5f);
  EXPECT_TRUE(r.chat.seed_given);
  EXPECT_EQ(r.chat.sampling.seed, 3u);
  EXPECT_TRUE(r.chat.stream);
  EXPECT_EQ(r.chat.mode, chat::Mode::Chat);
  EXPECT_TRUE(r.chat.unknown_fields.empty());
  EXPECT_EQ(r.chat.messages, Json::parse(R"([{"role":"system","content":"Be brief."},
                                             {"role":"user","content":"Name a colour."}])"));
  EXPECT_EQ(render_chat(r.chat), chat_prompt(R"({"messages":[{"role":"system","content":"Be brief."},
                                                              {"role":"user","content":"Name a colour."}]})"));
  EXPECT_EQ(r.echo["instructions"], "Be brief.");
  EXPECT_EQ(r.echo["max_output_tokens"], 7);
  EXPECT_EQ(r.echo["metadata"], Json::parse(R"({"k":"v"})"));
  EXPECT_EQ(r.echo["store"], false);  // nothing is kept, whatever was asked
}

TEST(ServeResponsesRequest, InputItemsWithAToolRoundTrip) {
  ResponsesRequest r = parse_ok(R"({"input":[
      {"role":"developer","content":[{"type":"input_text","text":"Use "},{"type":"input_text","text":"tools."}]},
      {"type":"message","role":"user","content":[{"type":"input_text","text":"Weather in Paris?"}]},
      {"type":"reasoning","id":"rs_1","summary":[],"content":[{"type":"reasoning_text","text":"Ask the tool."}]},
      {"type":"function_call","call_id":"c1","name":"get_weather","arguments":"{\"city\": \"Paris\"}"},
      {"type":"function_call","call_id":"c2","name":"get_weather","arguments":"{\"city\": \"Lyon\"}"},
      {"type":"function_call_output","call_id":"c1","output":"sunny"},
      {"type":"function_call_output","call_id":"c2","output":[{"type":"input_text","text":"rain"}]},
      {"role":"assistant","content":[{"type":"output_text","text":"Sunny; rain.","annotations":[]}]},
      {"role":"user","content":"Thanks"}],
    "tools":[{"type":"function","name":"get_weather","description":"Weather of a city",
              "parameters":{"type":"object","properties":{"city":{"type":"string"}}},"strict":true}],
    "tool_choice":{"type":"function","name":"get_weather"},"parallel_tool_calls":false})");
  const Json want = Json::parse(R"([
      {"role":"developer","content":"Use tools."},
      {"role":"user","content":"Weather in Paris?"},
      {"role":"assistant","content":"","tool_calls":[
          {"id":"c1","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}},
          {"id":"c2","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Lyon\"}"}}],
       "reasoning_content":"Ask the tool."},
      {"role":"tool","tool_call_id":"c1","content":"sunny"},
      {"role":"tool","tool_call_id":"c2","content":"rain"},
      {"role":"assistant","content":"Sunny; rain."},
      {"role":"user","content":"Thanks"}])");
  EXPECT_EQ(r.chat.messages, want);
  // Tools in the chat shape, offered to the model as the chat endpoint offers them.
  ASSERT_EQ(r.chat.tools.size(), 1u);
  EXPECT_EQ(r.chat.tools[0]["function"]["name"], "get_weather");
  EXPECT_EQ(r.chat.tools[0]["function"]["parameters"]["properties"]["city"]["type"], "string");
  Json chat = {{"messages", want}, {"tools", r.chat.tools}};
  EXPECT_EQ(render_chat(r.chat), chat_prompt(chat.dump()));
  // The response repeats the tools as sent (flat), and tool_choice / parallel_tool_calls.
  EXPECT_EQ(r.echo["tools"][0]["strict"], true);
  EXPECT_EQ(r.echo["tool_choice"]["name"], "get_weather");
  EXPECT_EQ(r.echo["parallel_tool_calls"], false);
  EXPECT_EQ(r.chat_body["tool_choice"], "required");
  // A prompt with a tool round trip encodes (the encoder accepts the history).
  PromptResult p = build_prompt(r.chat, tokenizer(), 4096, {});
  ASSERT_FALSE(p.error) << p.error->message;
  EXPECT_NE(tokenizer().decode(p.prompt->tokens).find("<tool_result>sunny</tool_result>"), std::string::npos);
}

TEST(ServeResponsesRequest, ReasoningTextFormatAndUnknownFields) {
  EXPECT_EQ(parse_ok(R"({"input":"x","reasoning":{"effort":"medium"}})").chat.mode, chat::Mode::Thinking);
  ResponsesRequest max = parse_ok(R"({"input":"x","reasoning":{"effort":"xhigh","summary":"auto"}})");
  EXPECT_EQ(max.chat.mode, chat::Mode::Thinking);
  EXPECT_EQ(max.chat.reasoning_effort, "max");
  EXPECT_EQ(max.echo["reasoning"]["summary"], "auto");
  EXPECT_EQ(parse_ok(R"({"input":"x","reasoning":{"effort":"none"}})").chat.mode, chat::Mode::Chat);
  EXPECT_EQ(parse_ok(R"({"input":"x","reasoning":{}})").chat.mode, chat::Mode::Chat);
  // text.format goes where chat's response_format goes, in the chat shape.
  ResponsesRequest js = parse_ok(R"({"input":"x","text":{"format":{"type":"json_schema","name":"pt","strict":true,
                                     "schema":{"type":"object","properties":{"x":{"type":"number"}}}}}})");
  EXPECT_EQ(js.chat.response_format, Json::parse(R"({"type":"json_schema","json_schema":{"name":"pt",
      "schema":{"type":"object","properties":{"x":{"type":"number"}}},"strict":true}})"));
  EXPECT_EQ(parse_ok(R"({"input":"x","text":{"format":{"type":"json_object"}}})").chat.response_format,
            Json::parse(R"({"type":"json_object"})"));
  EXPECT_TRUE(parse_ok(R"({"input":"x","text":{"format":{"type":"text"},"verbosity":"low"}})").chat.response_format.is_null());
  // Unknown fields are listed for the server's policy; the chat-only ones count as unknown here.
  ResponsesRequest u = parse_ok(R"({"input":"x","frobnicate":1,"messages":[],"truncation":"auto"})");
  EXPECT_EQ(u.chat.unknown_fields, (std::vector<std::string>{"frobnicate", "messages", "truncation"}));
  // tool_choice "none" drops the tools, as in chat.
  EXPECT_TRUE(parse_ok(R"({"input":"x","tool_choice":"none","tools":[{"type":"function","name":"f"}]})")
                  .chat.tools.is_null());
}

TEST(ServeResponsesRequest, BadInputNamesTheResponsesField) {
  struct Case {
    const char* body;
    const char* param;
    const char* says;
  } cases[] = {
      {"{not json", "", "not valid JSON"},
      {"[]", "", "JSON object"},
      {R"({"model":"m"})", "input", "'input' is required"},
      {R"({"input":[]})", "input", "non-empty"},
      {R"({"input":5})", "input", "string or a non-empty array"},
      {R"({"input":[7]})", "input[0]", "must be an object"},
      {R"({"input":[{"role":"tool","content":"x"}]})", "input[0].role", "got 'tool'"},
      {R"({"input":[{"role":"user"}]})", "input[0].content", "is required"},
      {R"({"input":[{"role":"user","content":[{"type":"input_image","image_url":"u"}]}]})",
       "input[0].content[0].type", "'input_image' are not supported"},
      {R"({"input":[{"type":"function_call","name":"f","arguments":"{}"}]})", "input[0].call_id", "must be a string"},
      {R"({"input":[{"type":"function_call_output","call_id":"c"}]})", "input[0].output", "is required"},
      {R"({"input":[{"type":"item_reference","id":"msg_1"}]})", "input[0]", "stored responses"},
      {R"({"input":[{"type":"web_search_call"}]})", "input[0].type", "'web_search_call' are not supported"},
      {R"({"input":"x","instructions":3})", "instructions", "must be a string"},
      {R"({"input":"x","tools":{}})", "tools", "must be an array"},
      {R"({"input":"x","tools":[{"type":"web_search"}]})", "tools[0].type", "only function tools"},
      {R"({"input":"x","tools":[{"type":"function"}]})", "tools[0].name", "must be a string"},
      {R"({"input":"x","tool_choice":"sometimes"})", "tool_choice", "\"auto\""},
      {R"({"input":"x","tool_choice":{"type":"function","name":"g"},"tools":[{"type":"function","name":"f"}]})",
       "tool_choice.name", "not in 'tools'"},
      {R"({"input":"x","max_output_tokens":0})", "max_output_tokens", "'max_output_tokens' must be in"},
      {R"({"input":"x","max_output_tokens":"many"})", "max_output_tokens", "'max_output_tokens' must be an integer"},
      {R"({"input":"x","temperature":3})", "temperature", "'temperature' must be in"},
      {R"({"input":"x","reasoning":{"effort":"huge"}})", "reasoning.effort", "got 'huge'"},
      {R"({"input":"x","reasoning":"high"})", "reasoning", "must be an object"},
      {R"({"input":"x","text":{"format":{"type":"yaml"}}})", "text.format.type", "got 'yaml'"},
      {R"({"input":"x","text":{"format":{"type":"json_schema","name":"n"}}})", "text.format.schema", "object"},
      {R"({"input":"x","metadata":{"k":1}})", "metadata", "'metadata.k' must be a string"},
      {R"({"input":"x","store":"yes"})", "store", "true or false"},
      {R"({"input":"x","previous_response_id":"resp_1"})", "previous_response_id", "stored responses are not supported"},
  };
  for (const Case& c : cases) {
    ApiError e = parse_bad(c.body);
    EXPECT_EQ(e.status, 400) << c.body;
    EXPECT_EQ(e.param, c.param) << c.body << ": " << e.message;
    EXPECT_NE(e.message.find(c.says), std::string::npos) << c.body << ": " << e.message;
  }
  // Deep nesting is refused before anything recurses over it.
  std::string deep = R"({"input":)" + std::string(100000, '[') + std::string(100000, ']') + "}";
  EXPECT_NE(parse_bad(deep).message.find("nested deeper"), std::string::npos);
  // The shared prompt checks, reworded: the context overflow names max_output_tokens.
  ResponsesRequest r = parse_ok(R"({"input":"hello","max_output_tokens":100})");
  PromptResult p = build_prompt(r.chat, tokenizer(), 50, {});
  ASSERT_TRUE(p.error);
  ApiError e = responses_error(*p.error);
  EXPECT_EQ(e.param, "max_output_tokens");
  EXPECT_NE(e.message.find("maximum context length is 50 tokens"), std::string::npos);
}

TEST(ServeResponsesResponder, TextStreamEventsInOrderAndAgreeWithTheBody) {
  ResponsesRequest req = parse_ok(R"({"input":"x","instructions":"Be brief.","temperature":0.5,"stream":true})");
  Outcome r = run(req, scripted("The sky is blue.", "stop", true));
  const std::vector<std::string> head = {"response.created", "response.in_progress", "response.output_item.added",
                                         "response.content_part.added"};
  const std::vector<std::string> tail = {"response.output_text.done", "response.content_part.done",
                                         "response.output_item.done", "response.completed"};
  std::vector<std::string> t = types(r.events);
  ASSERT_GT(t.size(), head.size() + tail.size());
  EXPECT_EQ(std::vector<std::string>(t.begin(), t.begin() + 4), head);
  EXPECT_EQ(std::vector<std::string>(t.end() - 4, t.end()), tail);
  std::string deltas;
  for (size_t i = 0; i < r.events.size(); ++i) {
    const Json& d = r.events[i].data;
    EXPECT_EQ(d["type"], r.events[i].type);
    EXPECT_EQ(d["sequence_number"], i);
    if (r.events[i].type == "response.output_text.delta") {
      EXPECT_EQ(d["item_id"], "msg_00ab");
      EXPECT_EQ(d["output_index"], 0);
      deltas += d["delta"].get<std::string>();
    }
  }
  EXPECT_EQ(deltas, "The sky is blue.");
  EXPECT_EQ(r.events[0].data["response"]["status"], "in_progress");
  EXPECT_TRUE(r.events[0].data["response"]["output"].empty());
  const Json& done = r.events.back().data["response"];
  EXPECT_EQ(done, r.body);  // the plain body is the streamed final response
  EXPECT_EQ(r.body["id"], "resp_00ab");
  EXPECT_EQ(r.body["object"], "response");
  EXPECT_EQ(r.body["created_at"], 1700000000);
  EXPECT_EQ(r.body["status"], "completed");
  EXPECT_TRUE(r.body["incomplete_details"].is_null());
  EXPECT_TRUE(r.body["error"].is_null());
  EXPECT_EQ(r.body["model"], "default");
  EXPECT_EQ(r.body["instructions"], "Be brief.");
  EXPECT_FLOAT_EQ(r.body["temperature"].template get<float>(), 0.5f);
  EXPECT_EQ(r.body["tool_choice"], "auto");
  EXPECT_EQ(r.body["text"], Json::parse(R"({"format":{"type":"text"}})"));
  ASSERT_EQ(r.body["output"].size(), 1u);
  EXPECT_EQ(r.body["output"][0], Json::parse(R"({"id":"msg_00ab","type":"message","status":"completed",
      "role":"assistant","content":[{"type":"output_text","text":"The sky is blue.","annotations":[],"logprobs":[]}]})"));
  EXPECT_EQ(r.body["usage"], Json::parse(R"({"input_tokens":20,"input_tokens_details":{"cached_tokens":3,"cache_write_tokens":0},
      "output_tokens":5,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":25})"));
}

TEST(ServeResponsesResponder, ReasoningThenTextThenToolCalls) {
  ResponsesRequest req = parse_ok(R"({"input":"x","reasoning":{"effort":"high"},
                                      "tools":[{"type":"function","name":"f"}]})");
  Json call = {{"type", "function"}, {"function", {{"name", "f"}, {"arguments", R"({"x": 1})"}}}};
  const std::string answer = "Think hard.</think>" + model_output({{"role", "assistant"}, {"content", "Calling."},
                                                                    {"tool_calls", Json::array({call})}});
  Outcome r = run(req, scripted(answer, "stop", true, 3));
  std::vector<std::string> t = types(r.events);
  auto first = [&](const std::string& type) { return std::find(t.begin(), t.end(), type) - t.begin(); };
  // Reasoning item (index 0) closes before the message (index 1) opens; the call (index 2) last.
  EXPECT_LT(first("response.reasoning_text.delta"), first("response.reasoning_text.done"));
  EXPECT_LT(first("response.reasoning_text.done"), first("response.output_text.delta"));
  EXPECT_LT(first("response.output_text.done"), first("response.function_call_arguments.delta"));
  EXPECT_EQ(t.back(), "response.completed");
  std::string reasoning, args;
  for (const Sse& e : r.events) {
    if (e.type == "response.reasoning_text.delta") {
      EXPECT_EQ(e.data["output_index"], 0);
      reasoning += e.data["delta"].get<std::string>();
    }
    if (e.type == "response.output_text.delta") EXPECT_EQ(e.data["output_index"], 1);
    if (e.type == "response.function_call_arguments.delta") {
      EXPECT_EQ(e.data["output_index"], 2);
      EXPECT_EQ(e.data["item_id"], "fc_00ab_0");
      args += e.data["delta"].get<std::string>();
    }
    if (e.type == "response.function_call_arguments.done") EXPECT_EQ(e.data["arguments"], args);
  }
  EXPECT_EQ(reasoning, "Think hard.");
  EXPECT_EQ(Json::parse(args), Json::parse(R"({"x": 1})"));
  EXPECT_EQ(r.events.back().data["response"], r.body);
  const Json& out = r.body["output"];
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0], Json::parse(R"({"id":"rs_00ab","type":"reasoning","summary":[],
      "content":[{"type":"reasoning_text","text":"Think hard."}],"status":"completed"})"));
  EXPECT_EQ(out[1]["content"][0]["text"], "Calling.");
  EXPECT_EQ(out[2]["type"], "function_call");
  EXPECT_EQ(out[2]["call_id"], "call_00ab_0");
  EXPECT_EQ(out[2]["name"], "f");
  EXPECT_EQ(out[2]["status"], "completed");
  EXPECT_EQ(r.body["status"], "completed");
  // "Think hard.</think>" is 19 bytes: pieces of 3 put "</think>" complete in the 7th token.
  EXPECT_EQ(r.body["usage"]["output_tokens_details"]["reasoning_tokens"], 7);
}

TEST(ServeResponsesResponder, ACallAloneHasNoMessageItem) {
  ResponsesRequest req = parse_ok(R"({"input":"x","tools":[{"type":"function","name":"f"}]})");
  Json call = {{"type", "function"}, {"function", {{"name", "f"}, {"arguments", R"({"a": "b"})"}}}};
  Outcome r = run(req, scripted(model_output({{"role", "assistant"}, {"content", ""}, {"tool_calls", Json::array({call})}}),
                            "stop", true));
  ASSERT_EQ(r.body["output"].size(), 1u);
  EXPECT_EQ(r.body["output"][0]["type"], "function_call");
  for (const Sse& e : r.events) EXPECT_EQ(e.type.find("output_text"), std::string::npos) << e.type;
  EXPECT_EQ(r.events.back().data["response"], r.body);
}

TEST(ServeResponsesResponder, BudgetRunOutIsIncomplete) {
  // Inside the reasoning: the reasoning item is incomplete, and an empty message closes the output.
  ResponsesRequest think = parse_ok(R"({"input":"x","reasoning":{"effort":"low"},"max_output_tokens":4})");
  Outcome a = run(think, scripted("Still thinking", "length", false));
  EXPECT_EQ(a.body["status"], "incomplete");
  EXPECT_EQ(a.body["incomplete_details"], Json::parse(R"({"reason":"max_output_tokens"})"));
  EXPECT_EQ(a.body["max_output_tokens"], 4);
  ASSERT_EQ(a.body["output"].size(), 2u);
  EXPECT_EQ(a.body["output"][0]["status"], "incomplete");
  EXPECT_EQ(a.body["output"][0]["content"][0]["text"], "Still thinking");
  EXPECT_EQ(a.body["output"][1]["status"], "incomplete");
  EXPECT_EQ(a.body["output"][1]["content"][0]["text"], "");
  EXPECT_EQ(a.body["usage"]["output_tokens_details"]["reasoning_tokens"], 4);
  EXPECT_EQ(a.events.back().type, "response.incomplete");
  EXPECT_EQ(a.events.back().data["response"], a.body);
  // Inside the text.
  Outcome b = run(parse_ok(R"({"input":"x","max_output_tokens":2})"), scripted("Half a", "length", false));
  EXPECT_EQ(b.body["status"], "incomplete");
  EXPECT_EQ(b.body["output"][0]["content"][0]["text"], "Half a");
  EXPECT_EQ(b.events.back().type, "response.incomplete");
}

TEST(ServeResponsesResponder, AnEngineErrorFailsTheResponse) {
  ResponsesRequest req = parse_ok(R"({"input":"x","stream":true})");
  std::vector<JobEvent> ev = scripted("Some", "error", false);
  ev.back().error = "out of memory";
  Outcome r = run(req, ev);
  EXPECT_EQ(r.events.back().type, "response.failed");
  const Json& resp = r.events.back().data["response"];
  EXPECT_EQ(resp["status"], "failed");
  EXPECT_EQ(resp["error"], Json::parse(R"({"code":"server_error","message":"out of memory"})"));
  ResponsesResponder plain(req, {"resp_1", 1, "m"}, tokenizer());
  for (const JobEvent& e : ev) plain.consume(e);
  EXPECT_TRUE(plain.failed());
  EXPECT_EQ(plain.error(), "out of memory");
}
