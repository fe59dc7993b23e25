// Fuzz target: the DeepSeek-V4 completion parsers and the streaming reasoning splitter
// (src/chat/dsv4_parse.cpp). Byte 0 picks the mode and the splitter's chunk size, the rest is
// the generated text. The lenient result goes back into the history and is encoded, as the
// chat loop does. Checks: parse_completion fails only with cm::Error;
// parse_completion_lenient never throws and, when the strict parse succeeds, agrees with it;
// the splitter's chunked output equals the text split at its first "</think>" (thinking mode)
// or the whole text as content (chat mode).
#include <string>

#include "chat/dsv4.h"
#include "common/error.h"
#include "fuzz_util.h"

using cm::fuzz::fuzz_check;
using cm::chat::Mode;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const Mode mode = data[0] & 1 ? Mode::Thinking : Mode::Chat;
  const size_t chunk = 1 + (data[0] >> 1);
  std::string_view text = cm::fuzz::as_text(data + 1, size - 1);

  bool strict_ok = false;
  cm::chat::Completion strict;
  try {
    strict = cm::chat::parse_completion(text, mode);
    strict_ok = true;
  } catch (const cm::Error&) {
  }
  cm::chat::Completion lenient = cm::chat::parse_completion_lenient(text, mode);  // must not throw
  // The chat loop appends the parsed turn to the history and encodes it on the next turn.
  nlohmann::ordered_json history = nlohmann::ordered_json::array();
  history.push_back({{"role", "user"}, {"content", "q"}});
  history.push_back(cm::chat::to_message(lenient));
  history.push_back({{"role", "user"}, {"content", "next"}});
  try {
    (void)cm::chat::encode_messages(history, {mode, true, true, ""});
  } catch (const cm::Error&) {
  }
  if (strict_ok) {
    fuzz_check(lenient.error.empty(), "lenient parse reports an error the strict parse did not");
    fuzz_check(lenient.content == strict.content && lenient.reasoning_content == strict.reasoning_content &&
                   lenient.tool_calls.size() == strict.tool_calls.size(),
               "lenient and strict parses disagree");
  } else {
    fuzz_check(!lenient.error.empty(), "lenient parse accepted what the strict parse refused");
  }

  cm::chat::ReasoningSplitter split(mode);
  std::string reasoning, content;
  for (size_t i = 0; i < text.size(); i += chunk) {
    auto d = split.push(text.substr(i, chunk));
    reasoning += d.reasoning;
    content += d.content;
  }
  auto d = split.flush();
  reasoning += d.reasoning;
  content += d.content;
  size_t end = text.find(cm::chat::kThinkEnd);
  if (mode == Mode::Chat) {
    fuzz_check(reasoning.empty() && content == text, "chat-mode split changed the text");
  } else if (end == std::string_view::npos) {
    fuzz_check(reasoning == text && content.empty(), "split without </think> is not all reasoning");
  } else {
    fuzz_check(reasoning == text.substr(0, end) && content == text.substr(end + cm::chat::kThinkEnd.size()),
               "split does not cut at the first </think>");
  }
  return 0;
}
