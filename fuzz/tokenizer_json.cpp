// Fuzz target: loading a tokenizer. The input is tokenizer.json, optionally followed by a NUL
// byte and tokenizer_config.json (JSON text holds no raw NUL, so the split is unambiguous);
// both go to Tokenizer::from_json, which Tokenizer::load uses. An accepted tokenizer then
// encodes a fixed text with and without special tokens and decodes what it produced, and
// every id it reports (BOS, EOS, added tokens) must be inside its vocabulary.
#include <string>

#include "common/error.h"
#include "fuzz_util.h"
#include "tokenizer/tokenizer.h"

using cm::fuzz::fuzz_check;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in = cm::fuzz::as_text(data, size);
  size_t nul = in.find('\0');
  std::string tok_json(in.substr(0, nul));
  std::string cfg_json(nul == std::string_view::npos ? std::string_view() : in.substr(nul + 1));
  try {
    cm::Tokenizer tok = cm::Tokenizer::from_json(tok_json, cfg_json);
    const int64_t n = tok.vocab_size();
    for (int32_t id : {tok.bos_id(), tok.eos_id()}) fuzz_check(id >= -1 && id < n, "BOS/EOS id outside the vocabulary");
    for (const cm::AddedToken& t : tok.added_tokens()) {
      fuzz_check(t.id >= 0 && t.id < n, "added token id outside the vocabulary");
      (void)tok.token_bytes(t.id);
    }
    const std::string text = "Hello, world! 123 <｜begin▁of▁sentence｜>\xE4\xBD\xA0\xE5\xA5\xBD \xFF\n\t x";
    for (bool special : {true, false}) {
      std::vector<int32_t> ids = tok.encode(text, {special, true});
      for (int32_t id : ids) fuzz_check(id >= 0 && id < n, "encode produced an id outside the vocabulary");
      (void)tok.decode(ids, !special);
      cm::StreamDecoder sd(tok);
      for (int32_t id : ids) (void)sd.push(id);
      (void)sd.flush();
    }
  } catch (const cm::Error&) {
  }
  return 0;
}
