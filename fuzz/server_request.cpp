// Fuzz target: what a client of `clawmine serve` controls — a request body for
// /v1/completions, /v1/chat/completions, /tokenize or /detokenize (src/serve/request.cpp), then
// the prompt built from it with the default model's tokenizer, and the chat streamer over the
// body's bytes as if the model had generated them (src/serve/chat_stream.cpp). Byte 0 picks the
// endpoint and the streamer's chunk size. Checks: nothing throws (the parsers return errors);
// an error always has a message and a 4xx status; an accepted request's prompt fits the
// context; the streamer's deltas add up exactly to its final reasoning and content.
// Build: add `clawmine_fuzz_target(server_request)` to fuzz/CMakeLists.txt.
#include <string>

#include "fuzz_util.h"
#include "serve/chat_stream.h"
#include "serve/request.h"
#include "tokenizer/tokenizer.h"

using cm::fuzz::fuzz_check;
namespace sv = cm::serve;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const cm::Tokenizer tok = cm::Tokenizer::load(CLAWMINE_DEFAULT_MODEL);
  if (size < 1) return 0;
  const std::string_view body = cm::fuzz::as_text(data + 1, size - 1);
  const int kind = data[0] & 3;
  const size_t chunk = 1 + (data[0] >> 2);
  auto check_error = [](const sv::ApiError& e) {
    fuzz_check(!e.message.empty() && e.status >= 400 && e.status < 500, "error without message or 4xx status");
    fuzz_check(!sv::error_json(e).empty(), "error JSON is empty");
  };
  if (kind == 2) {
    sv::TokenizeParse t = sv::parse_tokenize(body);
    if (t.error) check_error(*t.error);
  } else if (kind == 3) {
    sv::DetokenizeParse d = sv::parse_detokenize(body, tok.vocab_size());
    if (d.error) check_error(*d.error);
    else (void)tok.decode(d.tokens);
  } else {
    const sv::Endpoint ep = kind == 1 ? sv::Endpoint::Chat : sv::Endpoint::Completions;
    sv::ParseResult r = sv::parse_request(body, ep, {});
    fuzz_check(r.request.has_value() != r.error.has_value(), "parse gives neither or both of request and error");
    if (r.error) {
      check_error(*r.error);
    } else {
      // Every prompt of a list (and the logit_bias ids), as the server builds them.
      sv::PromptsResult p = sv::build_prompts(*r.request, tok, 4096, {});
      if (p.error) check_error(*p.error);
      else
        for (const sv::Prompt& one : p.prompts)
          fuzz_check(!one.tokens.empty() && int64_t(one.tokens.size()) + one.max_tokens <= 4096,
                     "accepted prompt does not fit the context");
    }
  }
  // The body's bytes as generated text through the chat streamer.
  sv::ChatStreamer cs(data[0] & 4 ? cm::chat::Mode::Thinking : cm::chat::Mode::Chat);
  std::string reasoning, content;
  for (size_t i = 0; i < body.size(); i += chunk) {
    auto d = cs.push(body.substr(i, chunk));
    reasoning += d.reasoning;
    content += d.content;
  }
  auto f = cs.finish(data[0] & 8);
  reasoning += f.delta.reasoning;
  content += f.delta.content;
  fuzz_check(reasoning == f.reasoning && content == f.content, "streamed deltas differ from the final answer");
  return 0;
}
