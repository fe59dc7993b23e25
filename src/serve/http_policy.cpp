// HTTP policies (see http_policy.h).
#include "serve/http_policy.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>

#include "common/error.h"

namespace cm::serve {

namespace {
std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace((unsigned char)s.front())) s.remove_prefix(1);
  while (!s.empty() && std::isspace((unsigned char)s.back())) s.remove_suffix(1);
  return s;
}
std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = char(std::tolower((unsigned char)c));
  return out;
}
}  // namespace

std::vector<std::string> parse_allowed_origins(std::string_view flag) {
  std::vector<std::string> out;
  if (trim(flag).empty()) return out;
  size_t start = 0;
  while (start <= flag.size()) {
    size_t comma = flag.find(',', start);
    if (comma == std::string_view::npos) comma = flag.size();
    std::string_view item = trim(flag.substr(start, comma - start));
    CM_CHECK(!item.empty(), "--allowed-origins: empty origin in '{}' (a comma list such as "
             "http://localhost:3000,https://app.example, or *)", flag);
    // An origin is scheme://host[:port]; a trailing slash never matches what browsers send.
    if (item.size() > 1 && item.back() == '/') item.remove_suffix(1);
    out.emplace_back(item);
    start = comma + 1;
  }
  CM_CHECK(out.size() == 1 || std::find(out.begin(), out.end(), "*") == out.end(),
           "--allowed-origins: '*' allows every origin; give it alone, not in a list");
  return out;
}

std::string cors_allow_origin(const std::vector<std::string>& allowed, std::string_view origin) {
  if (allowed.empty() || origin.empty()) return "";
  if (allowed.size() == 1 && allowed[0] == "*") return "*";
  // Scheme and host are case-insensitive; browsers send them lowercased.
  const std::string o = lower(origin);
  for (const std::string& a : allowed)
    if (lower(a) == o) return std::string(origin);
  return "";
}

std::optional<ApiError> check_body_type(std::string_view content_type, std::string_view body) {
  // The media type without parameters ("; charset=utf-8").
  const std::string type = lower(trim(content_type.substr(0, content_type.find(';'))));
  if (type.empty() || type == "application/json" ||
      (type.size() > 5 && type.compare(type.size() - 5, 5, "+json") == 0))
    return std::nullopt;
  const std::string hint = "send the request as JSON with 'Content-Type: application/json'";
  if (type == "application/x-www-form-urlencoded") {
    if (nlohmann::json::accept(body.begin(), body.end())) return std::nullopt;
    return ApiError{415, "invalid_request_error",
                    fmt::format("the body is form-encoded ({}) and not a JSON document; {}", type, hint), ""};
  }
  return ApiError{415, "invalid_request_error", fmt::format("unsupported Content-Type '{}'; {}", type, hint), ""};
}

}  // namespace cm::serve
