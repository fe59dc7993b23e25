// Fuzz target: a request body's structured-output fields (src/grammar: parse_request_format),
// the grammar compiled from them on a small made-up vocabulary, and a short walk of the matcher.
// Byte 0 seeds the walk. Checks: only cm::Error escapes; every token the mask allows is accepted;
// rollback restores the mask. (An empty mask ends the walk: a grammar may match nothing.)
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/error.h"
#include "fuzz_util.h"
#include "grammar/grammar.h"

using cm::fuzz::fuzz_check;

namespace {
cm::GrammarCompiler& compiler() {
  static cm::GrammarCompiler gc = [] {
    std::vector<std::string> v{""};  // 0: the stop token
    // Every byte, as a byte-level BPE vocabulary has, so any UTF-8 text can be spelled.
    for (int c = 0x01; c < 0x100; ++c) v.push_back(std::string(1, static_cast<char>(c)));
    for (const char* s : {"\"", "{\"", "\": ", "true", "null", "ab", "12", "\xc3\xa9", "\xe2\x82", "\xac"})
      v.push_back(s);
    return cm::GrammarCompiler(v, static_cast<int64_t>(v.size()) + 3, {0});
  }();
  return gc;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1 || size > 2048) return 0;
  uint32_t seed = data[0];
  auto body = nlohmann::json::parse(cm::fuzz::as_text(data + 1, size - 1), nullptr, false);
  if (body.is_discarded()) return 0;
  try {
    auto spec = cm::parse_request_format(body);
    if (!spec) return 0;
    auto m = compiler().matcher(*spec);
    std::vector<uint32_t> mask(cm::mask_words(m.vocab_size())), again(mask.size());
    for (int step = 0; step < 32 && !m.is_terminated(); ++step) {
      m.fill_mask(mask.data());
      std::vector<int32_t> ids;
      for (int64_t i = 0; i < m.vocab_size(); ++i)
        if ((mask[i >> 5] >> (i & 31)) & 1u) ids.push_back(static_cast<int32_t>(i));
      if (ids.empty()) break;
      seed = seed * 1103515245u + 12345u;
      int32_t t = ids[(seed >> 8) % ids.size()];
      fuzz_check(m.accept(t), "an allowed token was rejected");
      if (step == 3 && !m.is_terminated()) {
        m.rollback(1);
        m.fill_mask(again.data());
        fuzz_check(again == mask, "rollback did not restore the mask");
        fuzz_check(m.accept(t), "token rejected after rollback");
      }
    }
  } catch (const cm::Error&) {
  }
  return 0;
}
