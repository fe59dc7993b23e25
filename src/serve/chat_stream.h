// Splits a chat completion's text, as it streams, into reasoning_content, content and tool
// calls, so no DeepSeek-V4 markup (</think>, the DSML tool-call block) reaches a client.
//   thinking mode: everything before the first "</think>" is reasoning; the marker is dropped;
//   content ends where "\n\n<｜DSML｜tool_calls" (or any "<｜DSML｜") begins; the block is parsed
//   at the end with the strict DeepSeek-V4 parser into tool calls.
// Text that could be the start of a marker is held back until the next piece decides it. The
// deltas returned by push() and finish() add up to exactly the final reasoning and content, so a
// streamed answer and a non-streamed one are the same.
//
//   ChatStreamer cs(chat::Mode::Thinking);
//   for (piece : pieces) { auto d = cs.push(piece); send(d.reasoning, d.content); }
//   auto f = cs.finish(/*eos=*/true);   // last deltas + tool calls
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "chat/dsv4.h"

namespace cm::serve {

class ChatStreamer {
 public:
  explicit ChatStreamer(chat::Mode mode) : mode_(mode) {}
  struct Delta {
    std::string reasoning, content;
  };
  Delta push(std::string_view text);
  struct Final {
    Delta delta;                          // what was still held back
    std::vector<chat::ToolCall> tool_calls;
    std::string reasoning, content;       // the whole answer (for non-streamed responses)
  };
  // eos: the model ended with EOS (the parser needs it to accept a tool-call block).
  Final finish(bool eos);

 private:
  // Reasoning and content that are safe to release now (final = nothing can follow).
  void safe_views(bool final, std::string_view* reasoning, std::string_view* content) const;
  Delta take(std::string_view reasoning, std::string_view content);
  chat::Mode mode_;
  // A search over text that only grows at its end: resumes where the last one stopped (less the
  // pattern's length), so streaming N pieces stays linear in the text instead of quadratic.
  struct Finder {
    size_t pos = std::string_view::npos, scanned = 0;
    size_t find(std::string_view hay, std::string_view pat);
  };
  std::string all_;
  mutable Finder think_end_, calls_, dsml_;
  size_t sent_reasoning_ = 0, sent_content_ = 0;
};

}  // namespace cm::serve
