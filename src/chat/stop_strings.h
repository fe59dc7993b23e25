// Stop strings for streamed generation (`clawmine generate --stop STR`, the server's `stop`):
// text is released as soon as it cannot be the start of a stop string; when a stop string
// appears, the text before it is released and generation should end (the stop string itself is
// not output, as in the OpenAI API).
//
//   cm::chat::StopStrings stop({"\n\nUser:", "###"});
//   auto r = stop.push(piece);  print(r.text);  if (r.stopped) break;
//   ... at the end: print(stop.flush());
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace cm::chat {

// Length of the longest tail of `text` that is a proper prefix of `marker` (text that must be held
// back while streaming because the next piece could complete the marker).
size_t partial_suffix_len(std::string_view text, std::string_view marker);

class StopStrings {
 public:
  explicit StopStrings(std::vector<std::string> stops);  // empty strings are ignored
  struct Result {
    std::string text;      // safe to output now
    bool stopped = false;  // a stop string was found; nothing more will be released
  };
  Result push(std::string_view piece);
  std::string flush();  // held-back text at the end of generation (no stop string matched)
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
};

}  // namespace cm::chat
