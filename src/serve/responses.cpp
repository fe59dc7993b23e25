// POST /v1/responses (see responses.h): the request's translation onto the chat path, and the
// response object and its streamed events.
#include "serve/responses.h"

#include <fmt/format.h>

#include <limits>
#include <set>
#include <utility>

namespace cm::serve {

namespace {
using Json = nlohmann::ordered_json;

constexpr int kMaxDepth = 64;  // as the chat parser: nothing deeper reaches dump() or the encoder
constexpr size_t kMaxMetadata = 16;

struct Bad {
  ApiError e;
};
[[noreturn]] void bad(std::string param, std::string msg) {
  throw Bad{ApiError{400, "invalid_request_error", std::move(msg), std::move(param)}};
}

bool has(const Json& j, const char* k) { return j.is_object() && j.contains(k) && !j[k].is_null(); }

std::string str(const Json& j, const char* k, const std::string& where) {
  if (!has(j, k) || !j[k].is_string()) bad(where, fmt::format("'{}' must be a string", where));
  return j[k].get<std::string>();
}

// The body as JSON. The depth limit is checked while parsing (nlohmann's parser itself is
// iterative; what recurses is dump() and the chat encoder downstream).
Json parse_body(std::string_view body) {
  auto depth_guard = [](int depth, Json::parse_event_t, Json&) {
    if (depth > kMaxDepth) bad("", fmt::format("request JSON is nested deeper than {} levels", kMaxDepth));
    return true;
  };
  Json j = Json::parse(body.begin(), body.end(), depth_guard, /*allow_exceptions=*/false);
  if (j.is_discarded()) bad("", "request body is not valid JSON");
  if (!j.is_object()) bad("", "request body must be a JSON object");
  return j;
}

// Message or tool-output content: a string, or text parts (input_text / output_text / text,
// and a refusal's text) joined as the chat encoder joins its parts.
std::string content_text(const Json& c, const std::string& where) {
  if (c.is_string()) return c.get<std::string>();
  if (!c.is_array()) bad(where, fmt::format("'{}' must be a string or an array of text parts", where));
  std::string out;
  for (size_t i = 0; i < c.size(); ++i) {
    const std::string at = fmt::format("{}[{}]", where, i);
    const Json& p = c[i];
    if (!p.is_object() || !p.contains("type") || !p["type"].is_string())
      bad(at, fmt::format("'{}' must be an object with a string 'type'", at));
    const std::string type = p["type"].get<std::string>();
    if (type == "input_text" || type == "output_text" || type == "text") out += str(p, "text", at + ".text");
    else if (type == "refusal") out += str(p, "refusal", at + ".refusal");
    else bad(at + ".type", fmt::format("content parts of type '{}' are not supported (text only)", type));
  }
  return out;
}

// A reasoning item's text (its reasoning_text content, else its summaries), for the next
// assistant turn's reasoning_content.
std::string reasoning_text(const Json& item, const std::string& where) {
  for (const char* k : {"content", "summary"}) {
    if (!has(item, k)) continue;
    if (!item[k].is_array()) bad(where + "." + k, fmt::format("'{}.{}' must be an array", where, k));
    std::string out;
    for (size_t i = 0; i < item[k].size(); ++i) out += str(item[k][i], "text", fmt::format("{}.{}[{}].text", where, k, i));
    if (!out.empty() || std::string(k) == "summary") return out;
  }
  return "";
}

// input (+ instructions) -> chat messages.
Json input_messages(const Json& j) {
  Json msgs = Json::array();
  if (has(j, "instructions")) msgs.push_back({{"role", "system"}, {"content", str(j, "instructions", "instructions")}});
  if (!has(j, "input")) bad("input", "'input' is required");
  const Json& in = j["input"];
  if (in.is_string()) {
    msgs.push_back({{"role", "user"}, {"content", in}});
    return msgs;
  }
  if (!in.is_array() || in.empty()) bad("input", "'input' must be a string or a non-empty array of input items");
  std::string reasoning;     // from reasoning items, for the next assistant turn
  bool assistant_last = false;  // the last item made or extended an assistant turn
  auto assistant = [&](Json m) {
    if (!reasoning.empty()) m["reasoning_content"] = std::exchange(reasoning, "");
    msgs.push_back(std::move(m));
  };
  for (size_t i = 0; i < in.size(); ++i) {
    const std::string at = fmt::format("input[{}]", i);
    const Json& item = in[i];
    if (!item.is_object()) bad(at, fmt::format("'{}' must be an object", at));
    std::string type = "message";
    if (has(item, "type")) type = str(item, "type", at + ".type");
    if (type == "message") {
      const std::string role = str(item, "role", at + ".role");
      if (role != "user" && role != "system" && role != "developer" && role != "assistant")
        bad(at + ".role", fmt::format("'{}.role' must be user, system, developer or assistant (got '{}')", at, role));
      if (!has(item, "content")) bad(at + ".content", fmt::format("'{}.content' is required", at));
      Json m = {{"role", role}, {"content", content_text(item["content"], at + ".content")}};
      if (role == "assistant") assistant(std::move(m));
      else msgs.push_back(std::move(m));
      assistant_last = role == "assistant";
    } else if (type == "function_call") {
      Json call = {{"id", str(item, "call_id", at + ".call_id")},
                   {"type", "function"},
                   {"function",
                    {{"name", str(item, "name", at + ".name")}, {"arguments", str(item, "arguments", at + ".arguments")}}}};
      // Calls after an assistant message (or after each other) belong to that one turn.
      if (assistant_last) {
        Json& m = msgs.back();
        if (!m.contains("tool_calls")) m["tool_calls"] = Json::array();
        m["tool_calls"].push_back(std::move(call));
      } else {
        assistant({{"role", "assistant"}, {"content", ""}, {"tool_calls", Json::array({std::move(call)})}});
      }
      assistant_last = true;
    } else if (type == "function_call_output") {
      if (!has(item, "output")) bad(at + ".output", fmt::format("'{}.output' is required", at));
      msgs.push_back({{"role", "tool"},
                      {"tool_call_id", str(item, "call_id", at + ".call_id")},
                      {"content", content_text(item["output"], at + ".output")}});
      assistant_last = false;
    } else if (type == "reasoning") {
      reasoning += reasoning_text(item, at);
    } else if (type == "item_reference") {
      bad(at, "item references need stored responses, which this server does not keep: send the items themselves");
    } else {
      bad(at + ".type", fmt::format("input items of type '{}' are not supported (message, function_call, "
                                    "function_call_output, reasoning)",
                                    type));
    }
  }
  return msgs;
}

// Flat Responses function tools -> chat tools ({"type": "function", "function": {...}}).
Json chat_tools(const Json& tools) {
  if (!tools.is_array()) bad("tools", "'tools' must be an array");
  Json out = Json::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string at = fmt::format("tools[{}]", i);
    const Json& t = tools[i];
    if (!t.is_object()) bad(at, fmt::format("'{}' must be an object", at));
    const std::string type = str(t, "type", at + ".type");
    if (type != "function")
      bad(at + ".type", fmt::format("only function tools are supported (got '{}')", type));
    Json fn = {{"name", str(t, "name", at + ".name")}};
    if (has(t, "description")) fn["description"] = str(t, "description", at + ".description");
    if (has(t, "parameters")) {
      if (!t["parameters"].is_object()) bad(at + ".parameters", fmt::format("'{}.parameters' must be an object", at));
      fn["parameters"] = t["parameters"];
    }
    out.push_back({{"type", "function"}, {"function", std::move(fn)}});
  }
  return out;
}

// tool_choice: the chat strings as they are; {"type": "function", "name"} as "required" (the
// model cannot be held to one function; it is offered the tools and asked to call one).
Json chat_tool_choice(const Json& c, const Json& tools) {
  if (c.is_string()) return c;  // the chat parser checks the value
  if (!c.is_object() || !has(c, "type") || c["type"] != "function")
    bad("tool_choice", "'tool_choice' must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"name\": ...}");
  const std::string name = str(c, "name", "tool_choice.name");
  for (const Json& t : tools)
    if (t["function"]["name"] == name) return "required";
  bad("tool_choice.name", fmt::format("tool_choice names '{}', which is not in 'tools'", name));
}

// text.format -> chat's response_format (null for plain text).
Json chat_response_format(const Json& text) {
  if (!text.is_object()) bad("text", "'text' must be an object");
  if (!has(text, "format")) return Json();
  const Json& f = text["format"];
  if (!f.is_object()) bad("text.format", "'text.format' must be an object");
  const std::string type = str(f, "type", "text.format.type");
  if (type == "text") return Json();
  if (type == "json_object") return {{"type", "json_object"}};
  if (type != "json_schema")
    bad("text.format.type", fmt::format("'text.format.type' must be text, json_object or json_schema (got '{}')", type));
  if (!has(f, "schema") || !f["schema"].is_object()) bad("text.format.schema", "'text.format.schema' must be an object");
  Json js = {{"name", str(f, "name", "text.format.name")}};
  if (has(f, "description")) js["description"] = str(f, "description", "text.format.description");
  js["schema"] = f["schema"];
  if (has(f, "strict")) {
    if (!f["strict"].is_boolean()) bad("text.format.strict", "'text.format.strict' must be true or false");
    js["strict"] = f["strict"];
  }
  return {{"type", "json_schema"}, {"json_schema", std::move(js)}};
}

// The top-level fields read here (responses.h); others are the request's unknown_fields.
const std::set<std::string>& known_fields() {
  static const std::set<std::string> k = {
      "model", "input", "instructions", "tools", "tool_choice", "max_output_tokens", "temperature", "top_p",
      "stream", "reasoning", "text", "metadata", "user", "store", "seed", "previous_response_id",
      "parallel_tool_calls", "top_k", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty",
      "ignore_eos", "min_tokens", "stop_token_ids"};
  return k;
}

// The chat-completions body a Responses body means; `echo` gets the fields the response repeats.
Json chat_body(const Json& j, Json& echo) {
  if (has(j, "previous_response_id"))
    bad("previous_response_id", "stored responses are not supported (this server keeps none): send the whole "
                                "conversation in 'input' instead of 'previous_response_id'");
  Json c = Json::object();
  // Fields of the same name and meaning: the chat parser validates them.
  for (const char* k : {"model", "temperature", "top_p", "seed", "stream", "user", "top_k", "min_p",
                        "presence_penalty", "frequency_penalty", "repetition_penalty", "ignore_eos", "min_tokens",
                        "stop_token_ids"})
    if (has(j, k)) c[k] = j[k];
  if (has(j, "max_output_tokens")) c["max_tokens"] = j["max_output_tokens"];
  c["messages"] = input_messages(j);
  if (has(j, "tools")) c["tools"] = chat_tools(j["tools"]);
  if (has(j, "tool_choice")) c["tool_choice"] = chat_tool_choice(j["tool_choice"], c.value("tools", Json::array()));
  if (has(j, "text")) {
    Json rf = chat_response_format(j["text"]);
    if (!rf.is_null()) c["response_format"] = std::move(rf);
  }
  if (has(j, "reasoning")) {
    const Json& r = j["reasoning"];
    if (!r.is_object()) bad("reasoning", "'reasoning' must be an object");
    if (has(r, "effort")) {
      const std::string e = str(r, "effort", "reasoning.effort");
      if (e == "none" || e == "minimal") c["chat_template_kwargs"] = {{"thinking", false}};
      else if (e == "low" || e == "medium" || e == "high") c["reasoning_effort"] = "high";
      else if (e == "xhigh" || e == "max") c["reasoning_effort"] = "max";
      else bad("reasoning.effort", fmt::format("'reasoning.effort' must be none, minimal, low, medium, high, xhigh "
                                               "or max (got '{}')",
                                               e));
    }
  }
  if (has(j, "metadata")) {
    const Json& m = j["metadata"];
    if (!m.is_object() || m.size() > kMaxMetadata)
      bad("metadata", fmt::format("'metadata' must be an object of at most {} string values", kMaxMetadata));
    for (const auto& [k, v] : m.items())
      if (!v.is_string()) bad("metadata", fmt::format("'metadata.{}' must be a string", k));
  }
  for (const char* k : {"store", "parallel_tool_calls"})
    if (has(j, k) && !j[k].is_boolean()) bad(k, fmt::format("'{}' must be true or false", k));

  auto given = [&](const char* k, Json fallback) { return has(j, k) ? j[k] : fallback; };
  echo = {{"instructions", given("instructions", Json())},
          {"max_output_tokens", given("max_output_tokens", Json())},
          {"tools", given("tools", Json::array())},
          {"tool_choice", given("tool_choice", "auto")},
          {"parallel_tool_calls", given("parallel_tool_calls", true)},
          {"text", given("text", Json{{"format", {{"type", "text"}}}})},
          {"reasoning", given("reasoning", Json{{"effort", nullptr}, {"summary", nullptr}})},
          {"metadata", given("metadata", Json::object())},
          {"user", given("user", Json())},
          {"store", false}};  // nothing is kept, whatever the client asked
  return c;
}

// Chat field names in an error of the chat parser -> the Responses names.
constexpr std::pair<const char*, const char*> kRenamed[] = {{"max_tokens", "max_output_tokens"},
                                                            {"messages", "input"},
                                                            {"response_format", "text.format"},
                                                            {"reasoning_effort", "reasoning.effort"},
                                                            {"chat_template_kwargs", "reasoning"}};

template <typename Out, typename F>
Out guarded(F&& f) {
  Out out;
  try {
    f(out);
  } catch (const Bad& b) {
    out.error = b.e;
  } catch (const std::exception& e) {
    out.error = ApiError{400, "invalid_request_error", e.what(), ""};
  }
  return out;
}
}  // namespace

ApiError responses_error(ApiError e) {
  for (const auto& [from, to] : kRenamed) {
    if (e.param == from) e.param = to;
    const std::string q = fmt::format("'{}'", from);
    for (size_t p = e.message.find(q); p != std::string::npos; p = e.message.find(q, p + 1))
      e.message.replace(p, q.size(), fmt::format("'{}'", to));
  }
  if (e.param == "prompt") e.param = "input";
  return e;
}

ResponsesParse parse_responses_request(std::string_view body, const RequestDefaults& defaults) {
  return guarded<ResponsesParse>([&](ResponsesParse& out) {
    const Json j = parse_body(body);
    ResponsesRequest r;
    r.chat_body = chat_body(j, r.echo);
    ParseResult pr = parse_request(r.chat_body.dump(), Endpoint::Chat, defaults);
    if (pr.error) throw Bad{responses_error(*pr.error)};
    r.chat = std::move(*pr.request);
    r.chat.unknown_fields.clear();
    for (const auto& [k, v] : j.items())
      if (!known_fields().count(k)) r.chat.unknown_fields.push_back(k);
    out.request = std::move(r);
  });
}

}  // namespace cm::serve
