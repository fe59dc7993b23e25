// The stop rule; see stop_rule.h.
#include "runtime/stop_rule.h"

#include <algorithm>

namespace cm::runtime {

std::vector<int32_t> end_of_sequence_ids(const Config& cfg, const Tokenizer* tok, const GenerationDefaults& gd) {
  std::vector<int32_t> ids;
  for (int64_t e : cfg.eos_token_ids) ids.push_back(int32_t(e));
  if (tok && tok->eos_id() >= 0) ids.push_back(tok->eos_id());
  ids.insert(ids.end(), gd.eos_ids.begin(), gd.eos_ids.end());
  return ids;
}

StopRule::StopRule(StopParams p, const Tokenizer* tok, int64_t prompt_tokens)
    : p_(std::move(p)), prompt_tokens_(prompt_tokens), stop_(p_.stop) {
  if (tok) dec_.emplace(*tok);
  if (p_.min_tokens > 0) {
    if (!p_.ignore_eos) banned_ = p_.eos_ids;
    banned_.insert(banned_.end(), p_.stop_token_ids.begin(), p_.stop_token_ids.end());
  }
}

const std::vector<int32_t>& StopRule::banned_after(int64_t more) const {
  static const std::vector<int32_t> none;
  return generated_ + more < p_.min_tokens ? banned_ : none;
}

bool StopRule::is_end_id(int32_t id) const {
  auto has = [id](const std::vector<int32_t>& v) { return std::find(v.begin(), v.end(), id) != v.end(); };
  return (!p_.ignore_eos && has(p_.eos_ids)) || has(p_.stop_token_ids);
}

StopVerdict StopRule::on_token(int32_t id) {
  StopVerdict v;
  ++generated_;
  // An end id is not text: the generation ends before it would be decoded. Before min_tokens it
  // cannot end the generation (the sampler was told to avoid it; a caller that did not ban it gets
  // an ordinary token).
  if (generated_ > p_.min_tokens && is_end_id(id)) {
    v.done = v.eos = true;
    v.reason = "stop";
    return v;
  }
  if (dec_) v.text = stop_.push(dec_->push(id)).text;
  if (stop_.stopped()) {
    v.done = true;
    v.reason = "stop";
    return v;
  }
  // The token just accepted is fed next, at position prompt + generated - 1: it must lie inside
  // the context (the last token sampled at the context's end is output but never fed).
  if (generated_ >= p_.max_tokens || (p_.ctx > 0 && prompt_tokens_ + generated_ - 1 >= p_.ctx)) {
    v.done = true;
    v.reason = "length";
  }
  return v;
}

std::string StopRule::finish() {
  if (!dec_ || stop_.stopped()) return "";
  std::string tail = stop_.push(dec_->flush()).text;
  if (!stop_.stopped()) tail += stop_.flush();
  return tail;
}

}  // namespace cm::runtime
