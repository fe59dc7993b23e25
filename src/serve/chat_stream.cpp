// ChatStreamer (see chat_stream.h).
#include "serve/chat_stream.h"

#include <fmt/format.h>

#include <algorithm>

#include "chat/stop_strings.h"

namespace cm::serve {

namespace {
const std::string& calls_start() {
  static const std::string s = fmt::format("\n\n<{}tool_calls", chat::kDsml);
  return s;
}
const std::string& dsml_open() {
  static const std::string s = fmt::format("<{}", chat::kDsml);
  return s;
}
}  // namespace

size_t ChatStreamer::Finder::find(std::string_view hay, std::string_view pat) {
  if (pos != std::string_view::npos) return pos;
  const size_t from = scanned >= pat.size() ? scanned - pat.size() + 1 : 0;
  pos = hay.find(pat, from);
  scanned = hay.size();
  return pos;
}

void ChatStreamer::safe_views(bool final, std::string_view* reasoning, std::string_view* content) const {
  std::string_view all = all_;
  *reasoning = {};
  *content = {};
  if (mode_ == chat::Mode::Thinking) {
    const size_t p = think_end_.find(all, chat::kThinkEnd);
    if (p == std::string_view::npos) {
      *reasoning = all.substr(0, all.size() - (final ? 0 : chat::partial_suffix_len(all, chat::kThinkEnd)));
      return;
    }
    *reasoning = all.substr(0, p);
    all.remove_prefix(p + chat::kThinkEnd.size());
  }
  const size_t calls = calls_.find(all, calls_start());
  size_t end = std::min(calls, dsml_.find(all, dsml_open()));
  if (end != std::string_view::npos && calls == std::string_view::npos && !final) {
    // "<｜DSML｜" complete but not yet the whole "\n\n<｜DSML｜tool_calls": the newlines before it
    // may still belong to the block's opening.
    for (int i = 0; i < 2 && end > 0 && all[end - 1] == '\n'; ++i) --end;
  } else if (end == std::string_view::npos) {
    end = all.size();
    if (!final)
      end -= std::max(chat::partial_suffix_len(all, calls_start()), chat::partial_suffix_len(all, dsml_open()));
  }
  *content = all.substr(0, end);
}

ChatStreamer::Delta ChatStreamer::take(std::string_view reasoning, std::string_view content) {
  Delta d;
  if (reasoning.size() > sent_reasoning_) {
    d.reasoning = reasoning.substr(sent_reasoning_);
    sent_reasoning_ = reasoning.size();
  }
  if (content.size() > sent_content_) {
    d.content = content.substr(sent_content_);
    sent_content_ = content.size();
  }
  return d;
}

ChatStreamer::Delta ChatStreamer::push(std::string_view text) {
  all_ += text;
  std::string_view r, c;
  safe_views(false, &r, &c);
  return take(r, c);
}

ChatStreamer::Final ChatStreamer::finish(bool eos) {
  Final f;
  std::string_view r, c;
  safe_views(true, &r, &c);
  f.reasoning = r;
  f.content = c;
  // A well-formed answer goes through the strict parser (tool calls, and its exact split). Its
  // reasoning/content extend what was streamed, since both cut at the same markers.
  const std::string text = all_ + (eos ? std::string(chat::kEos) : std::string());
  chat::Completion parsed = chat::parse_completion_lenient(text, mode_);
  if (parsed.error.empty()) {
    if (parsed.reasoning_content.compare(0, sent_reasoning_, f.reasoning, 0, sent_reasoning_) == 0)
      f.reasoning = parsed.reasoning_content;
    if (parsed.content.compare(0, sent_content_, f.content, 0, sent_content_) == 0) f.content = parsed.content;
    f.tool_calls = std::move(parsed.tool_calls);
  }
  f.delta = take(f.reasoning, f.content);
  return f;
}

}  // namespace cm::serve
