// Fuzz target: encoding arbitrary bytes with the default model's tokenizer (loaded once from
// models/default, as the engine loads it). Checks the contract of tokenizer.h: every id is in
// the vocabulary, decode(encode(bytes)) == bytes with and without special-token parsing, and
// streaming the ids through StreamDecoder gives utf8_sanitize(bytes).
#include <string>

#include "common/error.h"
#include "fuzz_util.h"
#include "tokenizer/tokenizer.h"

using cm::fuzz::fuzz_check;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const cm::Tokenizer tok = cm::Tokenizer::load(CLAWMINE_DEFAULT_MODEL);
  std::string_view text = cm::fuzz::as_text(data, size);
  for (bool special : {true, false}) {
    std::vector<int32_t> ids = tok.encode(text, {special, false});
    for (int32_t id : ids) fuzz_check(id >= 0 && id < tok.vocab_size(), "id outside the vocabulary");
    fuzz_check(tok.decode(ids) == text, "decode(encode(bytes)) != bytes");
    cm::StreamDecoder sd(tok);
    std::string streamed;
    for (int32_t id : ids) streamed += sd.push(id);
    streamed += sd.flush();
    fuzz_check(streamed == cm::utf8_sanitize(text), "streamed decode != utf8_sanitize(bytes)");
  }
  return 0;
}
