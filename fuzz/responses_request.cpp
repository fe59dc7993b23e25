// Fuzz target: a body for /v1/responses (src/serve/responses.cpp), mapped onto the chat request it
// means and then built into a prompt with the default model's tokenizer, as the server does.
// Checks: nothing throws (the parser returns errors); an error has a message and a 4xx status, also
// once reworded for the Responses API; an accepted request is a chat request whose prompt fits the
// context.
#include <string>

#include "fuzz_util.h"
#include "serve/request.h"
#include "serve/responses.h"
#include "tokenizer/tokenizer.h"

using cm::fuzz::fuzz_check;
namespace sv = cm::serve;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const cm::Tokenizer tok = cm::Tokenizer::load(CLAWMINE_DEFAULT_MODEL);
  const std::string_view body = cm::fuzz::as_text(data, size);
  auto check_error = [](const sv::ApiError& e) {
    fuzz_check(!e.message.empty() && e.status >= 400 && e.status < 500, "error without message or 4xx status");
    const sv::ApiError r = sv::responses_error(e);
    fuzz_check(!r.message.empty() && r.status == e.status, "the reworded error lost its message or status");
  };
  sv::ResponsesParse r = sv::parse_responses_request(body, {});
  fuzz_check(r.request.has_value() != r.error.has_value(), "parse gives neither or both of request and error");
  if (r.error) return check_error(*r.error), 0;
  fuzz_check(r.request->chat.endpoint == sv::Endpoint::Chat, "a responses request must run as chat");
  sv::PromptsResult p = sv::build_prompts(r.request->chat, tok, 4096, {});
  if (p.error) return check_error(*p.error), 0;
  for (const sv::Prompt& one : p.prompts)
    fuzz_check(!one.tokens.empty() && int64_t(one.tokens.size()) + one.max_tokens <= 4096,
               "accepted prompt does not fit the context");
  return 0;
}
