#include "runtime/session.h"

#include <chrono>
#include <optional>

#include "common/error.h"
#include "chat/stop_strings.h"

namespace cm {

Session::Session(const Model& m, const Tokenizer* tok, ForwardOptions fo)
    : m_(m), tok_(tok), fo_(fo), st_(state_new(m.config)) {
  fo_.all_logits = false;
}

void Session::reset() {
  state_reset(st_);
  fed_.clear();
}

GenerateResult Session::generate(const GenerateRequest& req, const std::function<void(const std::string&)>& on_text,
                                 const std::atomic<bool>* cancel) {
  const Config& c = m_.config;
  GenerateResult r;
  CM_CHECK(!req.prompt.empty(), "empty prompt");
  CM_CHECK(req.max_tokens >= 0, "max_tokens must be >= 0");
  if (int64_t(req.prompt.size()) >= c.max_position_embeddings)
    fail("prompt of {} tokens does not fit the model's context of {}", req.prompt.size(), c.max_position_embeddings);
  Sampler sampler(req.sampling);
  chat::StopStrings stop(req.stop);
  // Reuse the state when the prompt extends what it already consumed (and adds at least one token).
  size_t keep = 0;
  if (fed_.size() < req.prompt.size() && std::equal(fed_.begin(), fed_.end(), req.prompt.begin())) keep = fed_.size();
  if (keep == 0 && !fed_.empty()) reset();
  r.prompt_tokens = int64_t(req.prompt.size());
  r.prompt_reused = int64_t(keep);

  auto t0 = std::chrono::steady_clock::now();
  std::vector<float> logits = forward(m_, st_, req.prompt.data() + keep, int64_t(req.prompt.size() - keep), fo_);
  fed_.assign(req.prompt.begin(), req.prompt.end());
  auto t1 = std::chrono::steady_clock::now();
  r.prompt_seconds = std::chrono::duration<double>(t1 - t0).count();

  std::vector<int32_t> hist = req.prompt;
  std::optional<StreamDecoder> dec;
  if (tok_) dec.emplace(*tok_, req.skip_special);
  auto emit = [&](const std::string& piece) {
    std::string out = stop.push(piece).text;
    if (!out.empty()) {
      r.text += out;
      if (on_text) on_text(out);
    }
  };
  r.finish_reason = "length";
  for (int64_t i = 0; i < req.max_tokens; ++i) {
    if (cancel && cancel->load()) {
      r.finish_reason = "cancelled";
      break;
    }
    if (st_.pos >= c.max_position_embeddings) break;  // context full: "length"
    int32_t id = sampler.sample(logits.data(), c.vocab_size, hist);
    hist.push_back(id);
    r.tokens.push_back(id);
    bool eos = false;
    for (int64_t e : c.eos_token_ids) eos |= e == id;
    if (tok_ && tok_->eos_id() == id) eos = true;
    for (int32_t e : req.eos_ids) eos |= e == id;
    if (eos && !req.ignore_eos) {
      r.finish_reason = "stop";
      break;
    }
    if (dec) emit(dec->push(id));
    if (stop.stopped()) {
      r.finish_reason = "stop";
      break;
    }
    if (i + 1 == req.max_tokens) break;
    logits = forward(m_, st_, &id, 1, fo_);
    fed_.push_back(id);
  }
  if (tok_ && !stop.stopped()) {
    emit(dec->flush());
    std::string tail = stop.flush();
    r.text += tail;
    if (on_text && !tail.empty()) on_text(tail);
  }
  r.gen_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  return r;
}

}  // namespace cm
