// A generation session: one slot of a ModelBackend and the tokens that slot
// has consumed. generate() feeds a prompt through step() in chunks of at most
// the backend's max_step_tokens (reusing the slot when the prompt extends what
// it already holds, as a multi-turn chat does), then samples until EOS, a stop
// string, max_tokens, the reserved context or a cancel flag, streaming text
// pieces to a callback. The CLI's generate and chat use it.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "seam/backend.h"
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
  // The backend must be reserved; the session owns `slot` of it.
  Session(ModelBackend& be, const Config& cfg, const Tokenizer* tok, int32_t slot = 0);
  // on_text receives printable UTF-8 pieces as they are produced (may be null).
  GenerateResult generate(const GenerateRequest& req, const std::function<void(const std::string&)>& on_text,
                          const std::atomic<bool>* cancel = nullptr);
  void reset();
  const std::vector<int32_t>& history() const { return fed_; }

 private:
  GenerateResult run(const GenerateRequest& req, const std::function<void(const std::string&)>& on_text,
                     const std::atomic<bool>* cancel);
  // Feeds tokens (continuing the slot) and returns the last one's logits.
  const std::vector<float>& feed(const int32_t* tokens, int64_t n);

  ModelBackend& be_;
  const Config& cfg_;
  const Tokenizer* tok_;
  int32_t slot_;
  std::vector<int32_t> fed_;  // tokens the slot has consumed
  std::vector<float> logits_;
  std::vector<int32_t> b_pos_, b_slot_;
  std::vector<uint8_t> b_logits_;
};

}  // namespace cm
