// DeepSeek-V4 chat format against golden outputs of the reference encoder/decoder
// (tests/data/chat/dsv4_cases.json, see the README there): every prompt byte-identical, every
// completion parsed to the same message or rejected like the reference. Plus Python-JSON
// formatting facts, the streaming reasoning splitter and error cases.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "chat/dsv4.h"
#include "chat/py_json.h"
#include "common/error.h"
#include "tokenizer/tokenizer.h"

using namespace cm;
using namespace cm::chat;
using Json = nlohmann::ordered_json;

namespace {
const Json& cases() {
  static Json j = [] {
    std::ifstream f(std::string(CLAWMINE_TEST_DATA) + "/chat/dsv4_cases.json");
    std::stringstream ss;
    ss << f.rdbuf();
    return Json::parse(ss.str());
  }();
  return j;
}
Mode mode_of(const Json& c) { return c["thinking_mode"] == "thinking" ? Mode::Thinking : Mode::Chat; }
}  // namespace

TEST(ChatDsv4, EncodeMatchesReferenceGoldens) {
  ASSERT_GE(cases()["encode"].size(), 25u);
  for (const Json& c : cases()["encode"]) {
    ChatOptions o;
    o.mode = mode_of(c);
    o.drop_thinking = c["drop_thinking"];
    o.add_bos = c["add_bos"];
    o.reasoning_effort = c["reasoning_effort"].is_null() ? "" : c["reasoning_effort"].get<std::string>();
    EXPECT_EQ(encode_messages(c["messages"], o), c["expected"].get<std::string>()) << "case " << c["name"];
  }
}

TEST(ChatDsv4, ParseMatchesReferenceIncludingMalformed) {
  int malformed = 0;
  for (const Json& c : cases()["parse"]) {
    std::string text = c["text"];
    const Json& want = c["expected"];
    if (want.contains("error")) {
      ++malformed;
      EXPECT_THROW(parse_completion(text, mode_of(c)), Error) << "case " << c["name"];
      EXPECT_FALSE(parse_completion_lenient(text, mode_of(c)).error.empty()) << "case " << c["name"];
    } else {
      Completion got;
      ASSERT_NO_THROW(got = parse_completion(text, mode_of(c))) << "case " << c["name"];
      EXPECT_EQ(to_message(got), want) << "case " << c["name"];
      EXPECT_TRUE(parse_completion_lenient(text, mode_of(c)).error.empty());
    }
  }
  EXPECT_GE(malformed, 8);
}

TEST(ChatDsv4, EncodeThenParseRoundTripsToolCalls) {
  // An assistant turn rendered into a prompt parses back to the same calls.
  Json msgs = Json::parse(R"([{"role": "user", "content": "q"},
    {"role": "assistant", "content": "", "reasoning_content": "r",
     "tool_calls": [{"type": "function", "function": {"name": "f",
       "arguments": "{\"a\": \"x\\ny\", \"b\": [1, 2.5, null], \"c\": {\"d\": true}}"}}]}])");
  std::string p = encode_messages(msgs, {.mode = Mode::Thinking, .drop_thinking = false});
  std::string marker = "<｜Assistant｜><think>";
  Completion c = parse_completion(p.substr(p.find(marker) + marker.size()), Mode::Thinking);
  ASSERT_EQ(c.tool_calls.size(), 1u);
  EXPECT_EQ(c.reasoning_content, "r");
  EXPECT_EQ(c.tool_calls[0].name, "f");
  EXPECT_EQ(c.tool_calls[0].arguments, R"({"a": "x\ny", "b": [1, 2.5, null], "c": {"d": true}})");
}

TEST(ChatDsv4, LenientParseKeepsRawText) {
  Completion c = parse_completion_lenient("thought</think>answer with <｜DSML｜ junk", Mode::Thinking);
  EXPECT_FALSE(c.error.empty());
  EXPECT_EQ(c.reasoning_content, "thought");
  EXPECT_EQ(c.content, "answer with <｜DSML｜ junk");
  Completion d = parse_completion_lenient("cut off mid answ", Mode::Chat);  // no EOS (length limit)
  EXPECT_EQ(d.content, "cut off mid answ");
}

TEST(ChatDsv4, RejectsBadMessages) {
  auto enc = [](const char* js, ChatOptions o = {}) { return encode_messages(Json::parse(js), o); };
  EXPECT_THROW(enc(R"({"role": "user"})"), Error);
  EXPECT_THROW(enc(R"([{"role": "wizard", "content": "x"}])"), Error);
  EXPECT_THROW(enc(R"([{"role": "developer", "content": ""}])"), Error);
  EXPECT_THROW(enc(R"([{"role": "user", "content": "x", "task": "dance"}])"), Error);
  EXPECT_THROW(enc(R"([{"role": "user", "content": [{"type": "image_url"}]}])"), Error);
  EXPECT_THROW(enc(R"([{"role": "user", "content": "x"}])", {.reasoning_effort = "extreme"}), Error);
  // Text-part arrays are accepted as content.
  EXPECT_EQ(enc(R"([{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}])"),
            "<｜begin▁of▁sentence｜><｜User｜>ab<｜Assistant｜></think>");
}

// Tool-call arguments are a JSON string parsed by the encoder: nesting past the
// limit is an error naming them (dumping it recursed without bound); invalid
// JSON is still rendered as raw text.
TEST(ChatDsv4, DeepToolArgumentsAreRefused) {
  auto with_args = [](const std::string& args) {
    Json msgs = Json::array({Json{{"role", "user"}, {"content", "q"}},
                             Json{{"role", "assistant"},
                                  {"content", ""},
                                  {"tool_calls", Json::array({Json{{"type", "function"},
                                                                   {"function", {{"name", "f"}, {"arguments", args}}}}})}}});
    return encode_messages(msgs, {});
  };
  std::string deep = "{\"a\":" + std::string(100000, '[') + std::string(100000, ']') + "}";
  std::string e;
  try {
    with_args(deep);
  } catch (const Error& x) {
    e = x.what();
  }
  EXPECT_EQ(e, "tool call arguments: JSON nested deeper than 64 levels");
  EXPECT_NE(with_args("{not json").find("{not json"), std::string::npos);
}

TEST(ChatDsv4, PromptTokenizesSpecialsAsSingleIds) {
  Tokenizer tok = Tokenizer::load(std::string(CLAWMINE_TEST_DATA) + "/tokenizer");
  Json msgs = Json::parse(R"([{"role": "user", "content": "你好"}])");
  auto ids = tok.encode(encode_messages(msgs, {.mode = Mode::Thinking}));
  ASSERT_GE(ids.size(), 5u);
  EXPECT_EQ(ids[0], tok.bos_id());
  EXPECT_EQ(ids[1], *tok.token_id("<｜User｜>"));
  EXPECT_EQ(ids[ids.size() - 2], *tok.token_id("<｜Assistant｜>"));
  EXPECT_EQ(ids.back(), *tok.token_id("<think>"));
}

TEST(PyJson, FloatReprMatchesPython) {
  // Values as Python 3 prints repr(float).
  EXPECT_EQ(py_float_repr(2.5), "2.5");
  EXPECT_EQ(py_float_repr(0.1), "0.1");
  EXPECT_EQ(py_float_repr(1e-07), "1e-07");
  EXPECT_EQ(py_float_repr(1.5e-05), "1.5e-05");
  EXPECT_EQ(py_float_repr(0.0001), "0.0001");
  EXPECT_EQ(py_float_repr(100.0), "100.0");
  EXPECT_EQ(py_float_repr(1e15), "1000000000000000.0");
  EXPECT_EQ(py_float_repr(1e16), "1e+16");
  EXPECT_EQ(py_float_repr(123456.789), "123456.789");
  EXPECT_EQ(py_float_repr(-0.0), "-0.0");
  EXPECT_EQ(py_float_repr(1.7976931348623157e308), "1.7976931348623157e+308");
  EXPECT_EQ(py_float_repr(5e-324), "5e-324");
}

TEST(PyJson, DumpsLikePython) {
  Json v = Json::parse(R"({"b": 1, "a": [true, null, "é\u0001\"\\\n\t/"], "c": {}, "d": [], "e": -3.0})");
  EXPECT_EQ(py_json_dumps(v), "{\"b\": 1, \"a\": [true, null, \"é\\u0001\\\"\\\\\\n\\t/\"], \"c\": {}, \"d\": [], \"e\": -3.0}");
}

TEST(ChatDsv4, ReasoningSplitterHandlesMarkerAcrossChunks) {
  ReasoningSplitter s(Mode::Thinking);
  std::string reasoning, content;
  for (const char* chunk : {"let me th", "ink</", "thi", "nk>The answer", " is 4."}) {
    auto d = s.push(chunk);
    reasoning += d.reasoning;
    content += d.content;
  }
  auto d = s.flush();
  reasoning += d.reasoning;
  content += d.content;
  EXPECT_EQ(reasoning, "let me think");
  EXPECT_EQ(content, "The answer is 4.");
  ReasoningSplitter chat(Mode::Chat);
  EXPECT_EQ(chat.push("</thi").content, "</thi");
  // A held partial marker that turns out not to be one is released as reasoning.
  ReasoningSplitter t(Mode::Thinking);
  EXPECT_EQ(t.push("a</th").reasoning, "a");
  EXPECT_EQ(t.push("ing").reasoning, "</thing");
}
