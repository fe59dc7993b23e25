// DeepSeek-V4 chat format: prompt encoding and completion parsing with the semantics of
// DeepSeek's reference encoder `encoding/encoding_dsv4.py` (re-implemented; golden outputs of the
// reference are in tests/data/chat/).
//
// PROMPT (encode_messages): messages are OpenAI-style JSON objects
//   {"role": "system"|"user"|"assistant"|"tool"|"developer"|"latest_reminder",
//    "content": str|null, "reasoning_content": str, "tool_calls": [{"id", "type", "function":
//    {"name", "arguments": JSON-string}}], "tool_call_id": str (role tool),
//    "tools": [{"type": "function", "function": {...}}] (system/developer),
//    "response_format": {...} (system/developer), "task": "action"|"query"|... , "wo_eos": bool}
// and become
//   BOS + [REASONING_EFFORT_MAX paragraph: thinking mode, effort "max", before message 0]
//   + system content [+ "\n\n## Tools ..." block] [+ "\n\n## Response Format ..."]
//   + per user turn  "<｜User｜>" content "<｜Assistant｜>" + ("<think>" or "</think>")
//   + per assistant  [reasoning "</think>"] content ["\n\n<｜DSML｜tool_calls>...</｜DSML｜tool_calls>"] EOS
// Rules (as the reference): "tool" messages are folded into a user message as
// <tool_result>…</tool_result> blocks joined by "\n\n" (sorted into the order of the preceding
// assistant's tool_calls ids), consecutive user messages merge the same way; in thinking mode the
// turn after the last user message opens with <think> and earlier turns' reasoning is dropped
// (drop_thinking, default) unless any message carries tools; chat mode always closes with </think>.
// Tool-call arguments that are not JSON are written as one string parameter "arguments" (as the
// reference does); JSON that is not an object is treated the same way (the reference crashes).
// Message content may be a string, null, or (extension) an array of {"type": "text"} parts.
// Not supported: the reference's `context` (pre-encoded prefix) argument.
//
// COMPLETION (parse_completion): the text the model generated after the prompt, EOS included:
//   thinking mode: reasoning "</think>" content [DSML tool calls] EOS
//   chat mode:     content [DSML tool calls] EOS
// parse_completion is as strict as the reference (it accepts and rejects the same texts) and
// throws cm::Error naming the defect for malformed output: missing </think> or EOS, text after
// EOS or after the tool-call block, malformed <｜DSML｜invoke>/<｜DSML｜parameter> tags, duplicate
// parameter names, special tokens inside content. parse_completion_lenient never throws: on a
// malformed completion it returns the reasoning (text before the first </think>, thinking mode)
// and the rest up to EOS as raw content, no tool calls, and the reason in `error`.
//
// Usage (CLI / server):
//   nlohmann::ordered_json msgs = nlohmann::ordered_json::array();
//   msgs.push_back({{"role", "system"}, {"content", sys}});
//   msgs.push_back({{"role", "user"}, {"content", question}});
//   std::string prompt = cm::chat::encode_messages(msgs, {.mode = cm::chat::Mode::Thinking});
//   auto ids = tokenizer.encode(prompt);              // specials parsed, no BOS added (V4 config)
//   ... generate until EOS (id tokenizer.eos_id()), decode the generated ids (EOS included) ...
//   cm::chat::Completion c = cm::chat::parse_completion_lenient(text, Mode::Thinking);
//   msgs.push_back(cm::chat::to_message(c));          // history for the next turn
#pragma once
#include <nlohmann/json.hpp>

#include <string>
#include <string_view>
#include <vector>

namespace cm::chat {

enum class Mode { Chat, Thinking };

inline constexpr std::string_view kBos = "<｜begin▁of▁sentence｜>";
inline constexpr std::string_view kEos = "<｜end▁of▁sentence｜>";
inline constexpr std::string_view kUser = "<｜User｜>";
inline constexpr std::string_view kAssistant = "<｜Assistant｜>";
inline constexpr std::string_view kThinkStart = "<think>";
inline constexpr std::string_view kThinkEnd = "</think>";
inline constexpr std::string_view kDsml = "｜DSML｜";

struct ChatOptions {
  Mode mode = Mode::Chat;
  bool drop_thinking = true;     // drop reasoning of turns before the last user message
  bool add_bos = true;           // start with BOS
  std::string reasoning_effort;  // "", "high" or "max" (only "max" changes the prompt)
};

// The prompt text (special tokens written literally; tokenize with specials parsed).
// cm::Error on malformed messages (unknown role, developer without content, bad task, ...).
std::string encode_messages(const nlohmann::ordered_json& messages, const ChatOptions& opt);

struct ToolCall {
  std::string name;
  std::string arguments;  // JSON object text, e.g. {"location": "Paris", "days": 3}
};

struct Completion {
  std::string content, reasoning_content;
  std::vector<ToolCall> tool_calls;
  std::string error;  // parse_completion_lenient only: why the text was malformed ("" if fine)
};

Completion parse_completion(std::string_view text, Mode mode);
Completion parse_completion_lenient(std::string_view text, Mode mode);

// {"role": "assistant", "content", "reasoning_content", "tool_calls": [{"type": "function",
// "function": {"name", "arguments"}}]} - the reference decoder's output shape, ready to append
// to the history.
nlohmann::ordered_json to_message(const Completion& c);

// Streaming split of generated text into reasoning and answer for display: in thinking mode all
// text before the first "</think>" is reasoning; the marker itself is dropped, and a partial
// marker at a chunk end is held back until the next chunk decides it.
class ReasoningSplitter {
 public:
  explicit ReasoningSplitter(Mode mode) : in_reasoning_(mode == Mode::Thinking) {}
  struct Delta {
    std::string reasoning, content;
  };
  Delta push(std::string_view text);
  Delta flush();
  bool in_reasoning() const { return in_reasoning_; }

 private:
  bool in_reasoning_;
  std::string held_;
};

}  // namespace cm::chat
