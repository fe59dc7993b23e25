// DeepSeek-V4 completion parsing (reasoning / content / DSML tool calls) and the streaming
// reasoning splitter; the accepted grammar is documented in dsv4.h and follows the reference
// decoder step by step (scan to the earliest of a set of stop strings, check what lies between).
#include <fmt/format.h>

#include "chat/dsv4.h"
#include "chat/py_json.h"
#include "chat/stop_strings.h"
#include "common/error.h"
#include "tokenizer/utf8.h"

namespace cm::chat {

namespace {

struct Scan {
  size_t next;            // index after the stop string (or text end)
  std::string_view before;
  int stop;               // index into the stop list, -1 if none was found
};

// Earliest occurrence of any stop string at or after `from` (ties: the first listed).
Scan read_until(std::string_view text, size_t from, std::initializer_list<std::string_view> stops) {
  size_t best = text.size();
  int which = -1, i = 0;
  for (std::string_view s : stops) {
    size_t p = text.find(s, from);
    if (p != std::string_view::npos && p < best) best = p, which = i;
    ++i;
  }
  if (which < 0) return {text.size(), text.substr(from), -1};
  return {best + (stops.begin() + which)->size(), text.substr(from, best - from), which};
}

// Python's str.isspace() for the \s of the reference's name regex.
bool py_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// Strips one suffix: `tail` at the very end, or `tail` + "\n" (Python's `$` also matches before a
// final newline). Returns false if neither fits.
bool strip_end(std::string_view& s, std::string_view tail) {
  if (s.size() >= tail.size() + 1 && s.back() == '\n' && s.substr(s.size() - 1 - tail.size(), tail.size()) == tail) {
    s.remove_suffix(tail.size() + 1);
    return true;
  }
  if (s.size() >= tail.size() && s.substr(s.size() - tail.size()) == tail) {
    s.remove_suffix(tail.size());
    return true;
  }
  return false;
}

// `\s*name="(.*?)">\n$` -> the tool name.
std::string invoke_name(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    size_t n = utf8::valid_seq_len(s, i);
    if (n == 0 || !py_space(utf8::decode(s, i, n))) break;
    i += n;
  }
  std::string_view rest = s.substr(i);
  CM_CHECK(rest.substr(0, 6) == "name=\"" && (rest.remove_prefix(6), strip_end(rest, "\">\n")),
           "chat: malformed tool call: bad invoke header '{}'", s);
  return std::string(rest);
}

// ` name="(.*?)" string="(true|false)">(.*?)<$` -> (name, is_string, value).
void parameter(std::string_view s, std::string& name, bool& is_string, std::string& value) {
  CM_CHECK(s.substr(0, 7) == " name=\"", "chat: malformed tool call parameter '{}'", s);
  std::string_view r = s.substr(7);
  for (size_t j = r.find("\" string=\""); j != std::string_view::npos; j = r.find("\" string=\"", j + 1)) {
    std::string_view after = r.substr(j + 10);
    for (std::string_view flag : {"true\">", "false\">"}) {
      if (after.substr(0, flag.size()) != flag) continue;
      std::string_view v = after.substr(flag.size());
      if (!strip_end(v, "<")) continue;
      name = std::string(r.substr(0, j));
      is_string = flag[0] == 't';
      value = std::string(v);
      return;
    }
  }
  fail("chat: malformed tool call parameter '{}'", s);
}

// The DSML block after "\n\n<｜DSML｜tool_calls"; returns the index after it.
size_t parse_tool_calls(std::string_view text, size_t index, std::vector<ToolCall>& calls) {
  const std::string invoke = fmt::format("<{}invoke", kDsml), invoke_end = fmt::format("</{}invoke", kDsml);
  const std::string param = fmt::format("<{}parameter", kDsml), param_end = fmt::format("/{}parameter", kDsml);
  const std::string block_end = fmt::format("</{}tool_calls>", kDsml);
  while (index < text.size()) {
    Scan s = read_until(text, index, {invoke, block_end});
    CM_CHECK(s.before == ">\n", "chat: malformed tool call block: expected '>\\n', got '{}'", s.before);
    index = s.next;
    if (s.stop == 1) break;
    CM_CHECK(s.stop == 0, "chat: malformed tool call block: missing </{}tool_calls>", kDsml);
    Scan h = read_until(text, index, {param, invoke_end});
    index = h.next;
    ToolCall call{invoke_name(h.before), ""};
    std::vector<std::pair<std::string, std::string>> args;  // name -> JSON value text
    int stop = h.stop;
    while (stop == 0) {
      Scan p = read_until(text, index, {param_end});
      index = p.next;
      std::string name, value;
      bool is_string = false;
      parameter(p.before, name, is_string, value);
      for (auto& a : args) CM_CHECK(a.first != name, "chat: malformed tool call: duplicate parameter '{}'", name);
      args.emplace_back(name, is_string ? py_json_string(value) : value);
      Scan after = read_until(text, index, {param, invoke_end});
      CM_CHECK(after.before == ">\n", "chat: malformed tool call parameter end: expected '>\\n', got '{}'", after.before);
      index = after.next;
      stop = after.stop;
    }
    std::string json(1, '{');
    for (size_t i = 0; i < args.size(); ++i) {
      if (i) json += ", ";
      json += py_json_string(args[i].first);
      json += ": ";
      json += args[i].second;
    }
    json += '}';
    call.arguments = std::move(json);
    calls.push_back(std::move(call));
  }
  return index;
}
}  // namespace

Completion parse_completion(std::string_view text, Mode mode) {
  Completion c;
  const std::string calls_start = fmt::format("\n\n<{}tool_calls", kDsml);
  size_t index = 0;
  if (mode == Mode::Thinking) {
    Scan s = read_until(text, 0, {kThinkEnd, calls_start});
    CM_CHECK(s.stop == 0, "chat: malformed completion: missing {}", kThinkEnd);
    c.reasoning_content = s.before;
    index = s.next;
  }
  Scan s = read_until(text, index, {kEos, calls_start});
  c.content = s.before;
  index = s.next;
  int stop = s.stop;
  if (stop == 1) {
    index = parse_tool_calls(text, index, c.tool_calls);
    Scan e = read_until(text, index, {kEos});
    CM_CHECK(e.before.empty(), "chat: malformed completion: text after the tool calls: '{}'", e.before);
    index = e.next;
  } else {
    CM_CHECK(stop == 0, "chat: malformed completion: missing {}", kEos);
  }
  CM_CHECK(index == text.size(), "chat: malformed completion: text after {}", kEos);
  for (std::string_view sp : {kBos, kEos, kThinkStart, kThinkEnd, kDsml})
    CM_CHECK(c.content.find(sp) == std::string::npos && c.reasoning_content.find(sp) == std::string::npos,
             "chat: malformed completion: special token {} inside the text", sp);
  return c;
}

Completion parse_completion_lenient(std::string_view text, Mode mode) {
  try {
    return parse_completion(text, mode);
  } catch (const Error& e) {
    Completion c;
    c.error = e.what();
    std::string_view rest = text;
    if (mode == Mode::Thinking) {
      size_t p = rest.find(kThinkEnd);
      if (p != std::string_view::npos) {
        c.reasoning_content = rest.substr(0, p);
        rest.remove_prefix(p + kThinkEnd.size());
      }
    }
    size_t e_pos = rest.find(kEos);
    c.content = rest.substr(0, e_pos);
    return c;
  }
}

nlohmann::ordered_json to_message(const Completion& c) {
  nlohmann::ordered_json calls = nlohmann::ordered_json::array();
  for (const ToolCall& t : c.tool_calls)
    calls.push_back({{"type", "function"}, {"function", {{"name", t.name}, {"arguments", t.arguments}}}});
  return {{"role", "assistant"}, {"content", c.content}, {"reasoning_content", c.reasoning_content},
          {"tool_calls", calls}};
}

ReasoningSplitter::Delta ReasoningSplitter::push(std::string_view text) {
  Delta d;
  if (!in_reasoning_) {
    d.content = text;
    return d;
  }
  held_ += text;
  size_t p = held_.find(kThinkEnd);
  if (p != std::string::npos) {
    d.reasoning = held_.substr(0, p);
    d.content = held_.substr(p + kThinkEnd.size());
    held_.clear();
    in_reasoning_ = false;
    return d;
  }
  // Keep back the longest suffix that could start "</think>".
  size_t keep = partial_suffix_len(held_, kThinkEnd);
  d.reasoning = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return d;
}

ReasoningSplitter::Delta ReasoningSplitter::flush() {
  Delta d;
  d.reasoning = std::move(held_);
  held_.clear();
  return d;
}

}  // namespace cm::chat
