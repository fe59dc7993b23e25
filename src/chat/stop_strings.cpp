// Stop-string matcher; see stop_strings.h.
#include "chat/stop_strings.h"

#include <algorithm>

namespace cm::chat {

size_t partial_suffix_len(std::string_view text, std::string_view marker) {
  if (marker.empty()) return 0;
  for (size_t k = std::min(text.size(), marker.size() - 1); k > 0; --k)
    if (text.substr(text.size() - k) == marker.substr(0, k)) return k;
  return 0;
}

StopStrings::StopStrings(std::vector<std::string> stops) {
  for (auto& s : stops)
    if (!s.empty()) stops_.push_back(std::move(s));
}

StopStrings::Result StopStrings::push(std::string_view piece) {
  Result r;
  if (stopped_) {
    r.stopped = true;
    return r;
  }
  held_ += piece;
  // Earliest complete stop string.
  size_t first = std::string::npos;
  for (const auto& s : stops_) first = std::min(first, held_.find(s));
  if (first != std::string::npos) {
    r.text = held_.substr(0, first);
    held_.clear();
    stopped_ = r.stopped = true;
    return r;
  }
  // Hold back the longest tail that is a proper prefix of some stop string.
  size_t keep = 0;
  for (const auto& s : stops_) keep = std::max(keep, partial_suffix_len(held_, s));
  r.text = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return r;
}

std::string StopStrings::flush() {
  std::string out = stopped_ ? "" : std::move(held_);
  held_.clear();
  return out;
}

}  // namespace cm::chat
