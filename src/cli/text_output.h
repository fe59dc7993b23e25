// Streaming generated text to the terminal for `generate` and `chat`: the
// thinking-mode reasoning (text before </think>) is shown dimmed on a
// terminal, separated from the answer by a blank line, or hidden.
#pragma once
#include <unistd.h>

#include <cstdio>
#include <string>

#include "chat/dsv4.h"

namespace cm::cli {

class TextPrinter {
 public:
  TextPrinter(chat::Mode mode, bool hide_reasoning)
      : split_(mode), hide_(hide_reasoning), tty_(::isatty(STDOUT_FILENO)) {}
  void push(const std::string& piece) { show(split_.push(piece)); }
  // End of an answer: prints what the splitter held back and resets the colour.
  void finish() {
    show(split_.flush());
    if (dim_ && tty_) std::fputs("\x1b[0m", stdout);
    dim_ = false;
    std::fflush(stdout);
  }

 private:
  void show(const chat::ReasoningSplitter::Delta& d) {
    if (!d.reasoning.empty() && !hide_) {
      if (!dim_ && tty_) std::fputs("\x1b[2m", stdout);
      dim_ = true;
      std::fputs(d.reasoning.c_str(), stdout);
    }
    if (!d.content.empty()) {
      if (dim_) std::fputs(tty_ ? "\x1b[0m\n\n" : "\n\n", stdout);
      dim_ = false;
      std::fputs(d.content.c_str(), stdout);
    }
    std::fflush(stdout);
  }
  chat::ReasoningSplitter split_;
  bool hide_, tty_, dim_ = false;
};

}  // namespace cm::cli
