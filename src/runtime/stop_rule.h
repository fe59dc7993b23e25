// When a generation ends, decided in one place for the server's engine and the CLI.
//
// A StopRule is built per request and fed every accepted token in order: on_token() says whether
// the generation ends with this token and why ("stop": an end-of-sequence id, a stop id or a stop
// string; "length": max_tokens or the context's end) and which text is released with it. Stop
// strings hold text back while it could still become a stop string (chat::StopStrings), so text
// reaches the client only once it is certain to be output; finish() releases what is held when the
// generation ends otherwise. The EOS set is built once, by end_of_sequence_ids().
//
//   StopRule rule(params, &tok, prompt.size());
//   for (;;) { id = sample(... banned = rule.banned()); auto v = rule.on_token(id); emit(v.text);
//              if (v.done) { emit(rule.finish()); break; } }
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "chat/stop_strings.h"
#include "model/config.h"
#include "sampling/generation_config.h"
#include "tokenizer/tokenizer.h"

namespace cm::runtime {

// The ids that end a sequence: the model config's eos_token_ids, the tokenizer's EOS (if given)
// and generation_config.json's, in that order (duplicates kept; membership is all that matters).
std::vector<int32_t> end_of_sequence_ids(const Config& cfg, const Tokenizer* tok, const GenerationDefaults& gd);

struct StopParams {
  std::vector<int32_t> eos_ids;        // end_of_sequence_ids()
  int64_t max_tokens = 16;             // generated tokens at most
  int64_t ctx = 0;                     // context end: prompt + generated never pass it (0: no limit)
  std::vector<std::string> stop;       // stop strings (not output)
  std::vector<int32_t> stop_token_ids; // ids that end the generation like EOS (not output as text)
  bool ignore_eos = false;             // EOS ids are ordinary tokens (stop ids still stop)
  int64_t min_tokens = 0;              // EOS and stop ids are banned until this many are generated
};

struct StopVerdict {
  bool done = false;
  std::string reason;  // when done: "stop" or "length"
  bool eos = false;    // ended by an EOS or stop id (which is not output as text)
  std::string text;    // text released with this token (may be empty while held back)
};

class StopRule {
 public:
  // tok may be null (token-only generation: no text, no stop strings). prompt_tokens: where the
  // generated tokens start, for the context end.
  StopRule(StopParams p, const Tokenizer* tok, int64_t prompt_tokens);
  // Ids the sampler must not pick now (EOS and stop ids while fewer than min_tokens are generated).
  const std::vector<int32_t>& banned() const { return banned_after(0); }
  // What banned() will return once `more` further tokens are accepted (an MTP verify row after drafts).
  const std::vector<int32_t>& banned_after(int64_t more) const;
  StopVerdict on_token(int32_t id);
  // The text still held (an incomplete UTF-8 character, a possible stop-string start) once the
  // generation ends for a reason other than a stop string or a cancel; empty after a stop string.
  std::string finish();
  int64_t generated() const { return generated_; }
  bool stopped_by_string() const { return stop_.stopped(); }

 private:
  bool is_end_id(int32_t id) const;

  StopParams p_;
  int64_t prompt_tokens_;
  std::optional<StreamDecoder> dec_;
  chat::StopStrings stop_;
  std::vector<int32_t> banned_;  // EOS and stop ids, for min_tokens
  int64_t generated_ = 0;
};

}  // namespace cm::runtime
