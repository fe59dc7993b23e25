// A generation session: one model, one sequence State, and the tokens that
// State has consumed. generate() feeds a prompt (reusing the State when the
// prompt extends what it already holds, as a multi-turn chat does), then
// samples until EOS, a stop string, max_tokens, the context limit or a
// cancel flag, streaming text pieces to a callback. The CLI's generate and
// chat and the server share it.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "model/model.h"
#include "sampling/sampler.h"
#include "tokenizer/tokenizer.h"

namespace cm {

struct GenerateRequest {
  std::vector<int32_t> prompt;
  int64_t max_tokens = 64;
  SamplingParams sampling;
  std::vector<std::string> stop;
  bool ignore_eos = false;
  bool skip_special = false;  // drop special tokens (</think>, DSML markers) from the text
  std::vector<int32_t> eos_ids;  // extra end ids (generation_config.json), besides the config's and tokenizer's
};

struct GenerateResult {
  std::vector<int32_t> tokens;  // generated ids (including a final EOS, if any)
  std::string text;             // decoded text, stop strings removed
  std::string finish_reason;    // "stop" (EOS or stop string), "length", "cancelled"
  int64_t prompt_tokens = 0, prompt_reused = 0;
  double prompt_seconds = 0, gen_seconds = 0;
};

class Session {
 public:
  Session(const Model& m, const Tokenizer* tok, ForwardOptions fo = {});
  // on_text receives printable UTF-8 pieces as they are produced (may be null).
  GenerateResult generate(const GenerateRequest& req, const std::function<void(const std::string&)>& on_text,
                          const std::atomic<bool>* cancel = nullptr);
  void reset();
  const std::vector<int32_t>& history() const { return fed_; }

 private:
  const Model& m_;
  const Tokenizer* tok_;
  ForwardOptions fo_;
  State st_;
  std::vector<int32_t> fed_;  // tokens the state has consumed
};

}  // namespace cm
