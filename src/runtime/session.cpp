#include "runtime/session.h"

#include <algorithm>
#include <chrono>
#include <optional>

#include "common/error.h"
#include "chat/stop_strings.h"

namespace cm {

Session::Session(ModelBackend& be, const Config& cfg, const Tokenizer* tok, int32_t slot)
    : be_(be), cfg_(cfg), tok_(tok), slot_(slot), logits_(size_t(cfg.vocab_size)) {
  be_.reset_slot(slot_);
  const int32_t n = be_.shape().max_step_tokens;
  b_pos_.resize(size_t(n));
  b_slot_.assign(size_t(n), slot_);
  b_logits_.resize(size_t(n));
}

void Session::reset() {
  be_.reset_slot(slot_);
  fed_.clear();
}

const std::vector<float>& Session::feed(const int32_t* tokens, int64_t n) {
  const int64_t chunk = be_.shape().max_step_tokens;
  for (int64_t i = 0; i < n; i += chunk) {
    const int32_t len = int32_t(std::min(chunk, n - i));
    const int64_t pos0 = be_.slot_pos(slot_);
    for (int32_t j = 0; j < len; ++j) {
      b_pos_[size_t(j)] = int32_t(pos0 + j);
      b_logits_[size_t(j)] = j + 1 == len ? 1 : 0;
    }
    Batch b{len, tokens + i, b_pos_.data(), b_slot_.data(), b_logits_.data()};
    be_.step(b, logits_.data());
  }
  return logits_;
}

GenerateResult Session::generate(const GenerateRequest& req, const std::function<void(const std::string&)>& on_text,
                                 const std::atomic<bool>* cancel) {
  try {
    return run(req, on_text, cancel);
  } catch (...) {
    reset();  // a failed step leaves the slot in no defined state: start the next request afresh
    throw;
  }
}

GenerateResult Session::run(const GenerateRequest& req, const std::function<void(const std::string&)>& on_text,
                            const std::atomic<bool>* cancel) {
  const Config& c = cfg_;
  const int64_t ctx = be_.shape().max_ctx;
  GenerateResult r;
  CM_CHECK(!req.prompt.empty(), "empty prompt");
  CM_CHECK(req.max_tokens >= 0, "max_tokens must be >= 0");
  if (int64_t(req.prompt.size()) >= ctx)
    fail("prompt of {} tokens does not fit the context of {} tokens", req.prompt.size(), ctx);
  Sampler sampler(req.sampling);
  chat::StopStrings stop(req.stop);
  // Reuse the state when the prompt extends what it already consumed (and adds at least one token).
  size_t keep = 0;
  if (fed_.size() < req.prompt.size() && std::equal(fed_.begin(), fed_.end(), req.prompt.begin())) keep = fed_.size();
  if (keep == 0) reset();
  r.prompt_tokens = int64_t(req.prompt.size());
  r.prompt_reused = int64_t(keep);

  auto t0 = std::chrono::steady_clock::now();
  std::vector<float> logits = feed(req.prompt.data() + keep, int64_t(req.prompt.size() - keep));
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
    if (be_.slot_pos(slot_) >= ctx) break;  // context full: "length"
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
    fed_.push_back(id);
    logits = feed(&id, 1);
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
