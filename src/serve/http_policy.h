// The server's HTTP policies as pure functions, so they are unit-tested without a socket:
//   CORS: which Origin a response may be shared with (--allowed-origins: off, "*", or a list);
//   bodies: which Content-Types a JSON endpoint reads. `curl -d '{...}'` sends JSON bytes as
//   application/x-www-form-urlencoded, so such a body is read as JSON when it parses as JSON
//   (llama-server and vLLM accept it the same way); any other type is a 415 that says what to send.
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "serve/request.h"

namespace cm::serve {

// "--allowed-origins" value -> origins: "" = CORS off (empty list), "*" = any, else a comma list
// (spaces around items ignored). cm::Error on an empty item or a "*" mixed with names.
std::vector<std::string> parse_allowed_origins(std::string_view flag);

// The Access-Control-Allow-Origin value for a request from `origin`: "" (send no CORS headers:
// CORS off, no Origin header, or an origin not in the list), "*" (any origin allowed) or the origin
// itself (listed; the response then also needs "Vary: Origin").
std::string cors_allow_origin(const std::vector<std::string>& allowed, std::string_view origin);

// Whether a JSON endpoint reads a body of this Content-Type: nullopt = yes; else the 415 to send.
// Accepted: no Content-Type, application/json (and any "+json" type), and form-encoded bytes that
// are a JSON document.
std::optional<ApiError> check_body_type(std::string_view content_type, std::string_view body);

}  // namespace cm::serve
