// DeepSeek-V4 prompt encoding (encode_messages); the rules are documented in dsv4.h. The steps
// mirror the reference encoder: fold tool messages into user messages, order tool results by
// call order, drop old reasoning, render each message, append the turn transition.
#include <fmt/format.h>

#include <algorithm>

#include "chat/dsv4.h"
#include "chat/py_json.h"
#include "common/error.h"
#include "io/input_file.h"

namespace cm::chat {

namespace {
using Json = nlohmann::ordered_json;

constexpr std::string_view kLatestReminder = "<｜latest_reminder｜>";

const char* kReasoningEffortMax =
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to "
    "resolve the root cause, rigorously stress-testing your logic against all potential paths, "
    "edge cases, and adversarial scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, "
    "considered alternative, and rejected hypothesis to ensure absolutely no assumption is left "
    "unchecked.\n\n";

// The "## Tools" block; {D} = ｜DSML｜, {S} = <think>, {E} = </think>, {T} = schemas.
const char* kToolsTemplate =
    "## Tools\n\n"
    "You have access to a set of tools to help answer the user's question. You can invoke tools "
    "by writing a \"<{D}tool_calls>\" block like the following:\n\n"
    "<{D}tool_calls>\n"
    "<{D}invoke name=\"$TOOL_NAME\">\n"
    "<{D}parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</{D}parameter>\n"
    "...\n"
    "</{D}invoke>\n"
    "<{D}invoke name=\"$TOOL_NAME2\">\n"
    "...\n"
    "</{D}invoke>\n"
    "</{D}tool_calls>\n\n"
    "String parameters should be specified as is and set `string=\"true\"`. For all other types "
    "(numbers, booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n\n"
    "If thinking_mode is enabled (triggered by {S}), you MUST output your complete reasoning "
    "inside {S}...{E} BEFORE any tool calls or final response.\n\n"
    "Otherwise, output directly after {E} with tool calls or final response.\n\n"
    "### Available Tool Schemas\n\n"
    "{T}\n\n"
    "You MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n";

std::string_view task_token(const std::string& task) {
  if (task == "action") return "<｜action｜>";
  if (task == "query") return "<｜query｜>";
  if (task == "authority") return "<｜authority｜>";
  if (task == "domain") return "<｜domain｜>";
  if (task == "title") return "<｜title｜>";
  if (task == "read_url") return "<｜read_url｜>";
  fail("chat: invalid task '{}' (action, query, authority, domain, title, read_url)", task);
}

std::string str_field(const Json& m, const char* key) {
  if (!m.contains(key) || m[key].is_null()) return "";
  CM_CHECK(m[key].is_string(), "chat: message field '{}' must be a string", key);
  return m[key].get<std::string>();
}
std::string role_of(const Json& m) { return str_field(m, "role"); }
bool truthy(const Json& m, const char* key) {
  if (!m.contains(key) || m[key].is_null()) return false;
  const Json& v = m[key];
  if (v.is_array() || v.is_object() || v.is_string()) return !v.empty();
  if (v.is_boolean()) return v.get<bool>();
  return true;
}
bool has_task(const Json& m) { return m.contains("task") && !m["task"].is_null(); }
// The "type" of a content part or block: its string value, "" when v is not an object or has no
// string "type" (json's value() would throw a bare type_error on a non-string).
std::string type_of(const Json& v) {
  if (!v.is_object() || !v.contains("type") || !v["type"].is_string()) return "";
  return v["type"].get<std::string>();
}

// Message content: string, null, or an array of {"type": "text", "text": ...} parts.
std::string text_of(const Json& c) {
  if (c.is_null()) return "";
  if (c.is_string()) return c.get<std::string>();
  CM_CHECK(c.is_array(), "chat: message content must be a string, null or an array of parts");
  std::string out;
  for (const Json& part : c) {
    CM_CHECK(part.is_object() && part.contains("type") && part["type"].is_string(),
             "chat: a content part must be an object with a string \"type\"");
    CM_CHECK(type_of(part) == "text", "chat: content part of type '{}' is not supported", type_of(part));
    out += str_field(part, "text");
  }
  return out;
}

std::string replace_all(std::string s, std::string_view from, std::string_view to) {
  for (size_t p = s.find(from); p != std::string::npos; p = s.find(from, p + to.size()))
    s.replace(p, from.size(), to);
  return s;
}

std::string render_tools(const Json& tools) {
  CM_CHECK(tools.is_array(), "chat: tools must be a list of {{\"type\": \"function\", \"function\": {{...}}}}");
  std::string schemas;
  for (size_t i = 0; i < tools.size(); ++i) {
    CM_CHECK(tools[i].is_object() && tools[i].contains("function"),
             "chat: tool {} is not {{\"type\": \"function\", \"function\": {{...}}}}", i);
    if (i) schemas += '\n';
    schemas += py_json_dumps(tools[i]["function"]);
  }
  std::string t = kToolsTemplate;
  t = replace_all(t, "{D}", kDsml);
  t = replace_all(t, "{S}", kThinkStart);
  t = replace_all(t, "{E}", kThinkEnd);
  return replace_all(t, "{T}", schemas);  // last, so schema text is never rewritten
}

std::string tools_and_format(const Json& m) {
  std::string out;
  if (truthy(m, "tools")) out += "\n\n" + render_tools(m["tools"]);
  if (truthy(m, "response_format"))
    out += "\n\n## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n" +
           py_json_dumps(m["response_format"]);
  return out;
}

// <｜DSML｜parameter ...> lines of one call: a JSON object's members, else the raw text.
std::string dsml_parameters(const Json& arguments) {
  Json args;
  bool is_object = false;
  if (arguments.is_string()) {
    // Not JSON: rendered as raw text below. Nested past the depth limit: an
    // error (dumping it would recurse without bound).
    try {
      args = parse_json_as<Json>(arguments.get_ref<const std::string&>(), "tool call arguments");
      is_object = args.is_object();
    } catch (const JsonTooDeep&) {
      throw;
    } catch (const Error&) {
    }
  }
  if (!is_object) args = Json{{"arguments", arguments}};
  std::string out;
  bool first = true;
  for (auto it = args.begin(); it != args.end(); ++it) {
    bool s = it.value().is_string();
    out += fmt::format("{}<{}parameter name=\"{}\" string=\"{}\">{}</{}parameter>", first ? "" : "\n", kDsml,
                       it.key(), s ? "true" : "false", s ? it.value().get<std::string>() : py_json_dumps(it.value()),
                       kDsml);
    first = false;
  }
  return out;
}

std::string dsml_tool_calls(const Json& calls) {
  CM_CHECK(calls.is_array(), "chat: tool_calls must be a list");
  std::string inner;
  for (size_t i = 0; i < calls.size(); ++i) {
    const Json& c = calls[i];
    CM_CHECK(c.is_object() && c.contains("function") && c["function"].is_object(),
             "chat: tool_calls[{}] has no \"function\"", i);
    const Json& f = c["function"];
    inner += fmt::format("{}<{}invoke name=\"{}\">\n{}\n</{}invoke>", i ? "\n" : "", kDsml, str_field(f, "name"),
                         dsml_parameters(f.contains("arguments") ? f["arguments"] : Json()), kDsml);
  }
  return fmt::format("\n\n<{}tool_calls>\n{}\n</{}tool_calls>", kDsml, inner, kDsml);
}

// Role "tool" -> tool_result blocks of a user message; consecutive user messages merge.
Json merge_tool_messages(const Json& messages) {
  Json merged = Json::array();
  for (const Json& m : messages) {
    CM_CHECK(m.is_object(), "chat: every message must be a JSON object");
    std::string role = role_of(m);
    auto last_is_open_user = [&](bool need_no_task) {
      return !merged.empty() && role_of(merged.back()) == "user" && merged.back().contains("content_blocks") &&
             (!need_no_task || !has_task(merged.back()));
    };
    if (role == "tool") {
      Json block = {{"type", "tool_result"},
                    {"tool_use_id", m.contains("tool_call_id") ? m["tool_call_id"] : Json("")},
                    {"content", m.contains("content") ? m["content"] : Json("")}};
      if (last_is_open_user(false)) merged.back()["content_blocks"].push_back(block);
      else merged.push_back({{"role", "user"}, {"content_blocks", Json::array({block})}});
    } else if (role == "user") {
      Json content = m.contains("content") ? m["content"] : Json("");
      Json block = {{"type", "text"}, {"text", content}};
      if (last_is_open_user(true)) {
        merged.back()["content_blocks"].push_back(block);
      } else {
        Json nm = {{"role", "user"}, {"content", content}, {"content_blocks", Json::array({block})}};
        for (const char* k : {"task", "wo_eos", "mask"})
          if (m.contains(k)) nm[k] = m[k];
        merged.push_back(nm);
      }
    } else {
      merged.push_back(m);
    }
  }
  return merged;
}

std::string id_string(const Json& v) { return v.is_string() ? v.get<std::string>() : ""; }

// Tool results of one user message follow the order of the last assistant's tool_calls ids.
void sort_tool_results(Json& messages) {
  std::vector<std::pair<std::string, int>> order;
  for (Json& m : messages) {
    std::string role = role_of(m);
    if (role == "assistant" && truthy(m, "tool_calls")) {
      order.clear();
      int idx = 0;
      for (const Json& tc : m["tool_calls"]) {
        std::string id = tc.contains("id") ? id_string(tc["id"]) : "";
        if (id.empty() && tc.contains("function") && tc["function"].contains("id")) id = id_string(tc["function"]["id"]);
        if (!id.empty()) {
          auto it = std::find_if(order.begin(), order.end(), [&](auto& p) { return p.first == id; });
          if (it != order.end()) it->second = idx;
          else order.emplace_back(id, idx);
        }
        ++idx;
      }
    } else if (role == "user" && truthy(m, "content_blocks")) {
      std::vector<Json> results;
      for (const Json& b : m["content_blocks"])
        if (type_of(b) == "tool_result") results.push_back(b);
      if (results.size() < 2 || order.empty()) continue;
      auto rank = [&](const Json& b) {
        std::string id = b.contains("tool_use_id") ? id_string(b["tool_use_id"]) : "";
        for (auto& [k, v] : order)
          if (k == id) return v;
        return 0;
      };
      std::stable_sort(results.begin(), results.end(), [&](const Json& a, const Json& b) { return rank(a) < rank(b); });
      size_t k = 0;
      for (Json& b : m["content_blocks"])
        if (type_of(b) == "tool_result") b = results[k++];
    }
  }
}

int last_user_index(const Json& messages) {
  for (int i = static_cast<int>(messages.size()) - 1; i >= 0; --i) {
    std::string r = role_of(messages[i]);
    if (r == "user" || r == "developer") return i;
  }
  return -1;
}

// Before the last user message: assistant turns lose their reasoning, developer turns go.
Json drop_thinking(const Json& messages) {
  int last_user = last_user_index(messages);
  Json out = Json::array();
  for (int i = 0; i < static_cast<int>(messages.size()); ++i) {
    const Json& m = messages[i];
    std::string r = role_of(m);
    if (r == "user" || r == "system" || r == "tool" || r == "latest_reminder" || r == "direct_search_results" ||
        i >= last_user) {
      out.push_back(m);
    } else if (r == "assistant") {
      Json c = m;
      c.erase("reasoning_content");
      out.push_back(c);
    }
  }
  return out;
}

std::string tool_result_text(const Json& c) {
  if (c.is_string()) return c.get<std::string>();
  if (c.is_null()) return "None";  // what the reference's str.format prints
  CM_CHECK(c.is_array(), "chat: tool result content must be a string or an array of parts");
  std::string out;
  for (size_t i = 0; i < c.size(); ++i) {
    std::string type = type_of(c[i]);
    if (i) out += "\n\n";
    out += type == "text" ? str_field(c[i], "text") : fmt::format("[Unsupported {}]", type);
  }
  return out;
}

std::string render_user(const Json& m) {
  std::string out(kUser);
  if (!truthy(m, "content_blocks")) return out + text_of(m.contains("content") ? m["content"] : Json());
  bool first = true;
  for (const Json& b : m["content_blocks"]) {
    std::string type = type_of(b);
    std::string part;
    if (type == "text") part = text_of(b.contains("text") ? b["text"] : Json());
    else if (type == "tool_result") part = "<tool_result>" + tool_result_text(b.contains("content") ? b["content"] : Json("")) + "</tool_result>";
    else part = fmt::format("[Unsupported {}]", type);
    if (!first) out += "\n\n";
    out += part;
    first = false;
  }
  return out;
}

std::string render_message(int index, const Json& messages, Mode mode, bool drop, const std::string& effort) {
  const Json& m = messages[index];
  const int last_user = last_user_index(messages);
  const bool thinking = mode == Mode::Thinking;
  std::string role = role_of(m);
  std::string out;
  if (index == 0 && thinking && effort == "max") out += kReasoningEffortMax;

  if (role == "system") {
    out += text_of(m.contains("content") ? m["content"] : Json()) + tools_and_format(m);
  } else if (role == "developer") {
    std::string content = text_of(m.contains("content") ? m["content"] : Json());
    CM_CHECK(!content.empty(), "chat: developer message {} has no content", index);
    out += std::string(kUser) + content + tools_and_format(m);
  } else if (role == "user") {
    out += render_user(m);
  } else if (role == "latest_reminder") {
    out += std::string(kLatestReminder) + text_of(m.contains("content") ? m["content"] : Json());
  } else if (role == "assistant") {
    std::string thinking_part;
    bool prev_has_task = index > 0 && has_task(messages[index - 1]);
    if (thinking && !prev_has_task && (!drop || index > last_user))
      thinking_part = str_field(m, "reasoning_content") + std::string(kThinkEnd);
    out += thinking_part + text_of(m.contains("content") ? m["content"] : Json());
    if (truthy(m, "tool_calls")) out += dsml_tool_calls(m["tool_calls"]);
    if (!(m.contains("wo_eos") && m["wo_eos"].is_boolean() && m["wo_eos"].get<bool>())) out += kEos;
  } else {
    fail("chat: unknown message role '{}' (message {})", role, index);
  }

  // Turn transition, only before an assistant/latest_reminder message or at the end.
  if (index + 1 < static_cast<int>(messages.size())) {
    std::string next = role_of(messages[index + 1]);
    if (next != "assistant" && next != "latest_reminder") return out;
  }
  if (has_task(m)) {
    CM_CHECK(m["task"].is_string(), "chat: message {} task must be a string", index);
    std::string task = m["task"].get<std::string>();
    std::string_view tok = task_token(task);
    if (task != "action") out += tok;
    else out += std::string(kAssistant) + std::string(thinking ? kThinkStart : kThinkEnd) + std::string(tok);
  } else if (role == "user" || role == "developer") {
    out += kAssistant;
    bool open_thinking = thinking && (!drop || index >= last_user);
    out += open_thinking ? kThinkStart : kThinkEnd;
  }
  return out;
}
}  // namespace

std::string encode_messages(const nlohmann::ordered_json& messages, const ChatOptions& opt) {
  CM_CHECK(messages.is_array(), "chat: messages must be a JSON array");
  CM_CHECK(opt.reasoning_effort.empty() || opt.reasoning_effort == "high" || opt.reasoning_effort == "max",
           "chat: reasoning_effort must be empty, \"high\" or \"max\" (got '{}')", opt.reasoning_effort);
  Json full = merge_tool_messages(messages);
  sort_tool_results(full);
  bool drop = opt.drop_thinking;
  for (const Json& m : full)
    if (truthy(m, "tools")) drop = false;
  if (opt.mode == Mode::Thinking && drop) full = drop_thinking(full);
  std::string prompt = opt.add_bos ? std::string(kBos) : "";
  for (int i = 0; i < static_cast<int>(full.size()); ++i)
    prompt += render_message(i, full, opt.mode, drop, opt.reasoning_effort);
  return prompt;
}

}  // namespace cm::chat
