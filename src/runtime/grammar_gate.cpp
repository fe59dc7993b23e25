// The engine's grammar gate (see grammar_gate.h).
#include "runtime/grammar_gate.h"

#include <algorithm>

#include "common/error.h"

namespace cm::runtime {

static Matcher make_matcher(const JobGrammar& g) {
  CM_CHECK(g.compiler && g.grammar, "engine: a job's grammar has no compiler or no compiled grammar");
  return g.compiler->matcher(g.grammar);
}

GrammarGate::GrammarGate(const JobGrammar& g, int64_t vocab, std::vector<int32_t> end_ids)
    : m_(make_matcher(g)), vocab_(vocab), after_token_(g.after_token), active_(g.after_token < 0),
      end_ids_(std::move(end_ids)) {
  CM_CHECK(m_.vocab_size() == vocab_, "engine: the grammar's vocabulary ({}) is not the logits width ({})",
           m_.vocab_size(), vocab_);
  mask_.resize(size_t(mask_words(vocab_)));
}

std::unique_ptr<TokenConstraint> JobGrammar::make(int64_t vocab, const std::vector<int32_t>& end_ids) const {
  return std::make_unique<GrammarGate>(*this, vocab, end_ids);
}

TokenConstraint::Constrained GrammarGate::constrain(const float* row, const std::vector<int32_t>& banned) {
  if (!active_) {
    // Before the grammar starts (reasoning): free text, but it may not end here.
    banned_ = banned;
    banned_.insert(banned_.end(), end_ids_.begin(), end_ids_.end());
    return {row, &banned_};
  }
  m_.fill_mask(mask_.data());
  auto allowed = [&](int32_t id) { return id >= 0 && id < vocab_ && ((mask_[size_t(id) >> 5] >> (id & 31)) & 1u); };
  // min_tokens bans end ids; honour it only while the grammar leaves some other token.
  const std::vector<int32_t>* ban = &banned;
  if (!banned.empty()) {
    int64_t n_allowed = 0;
    for (uint32_t w : mask_) n_allowed += __builtin_popcount(w);
    std::vector<int32_t> b = banned;
    std::sort(b.begin(), b.end());
    b.erase(std::unique(b.begin(), b.end()), b.end());
    const int64_t n_banned = std::count_if(b.begin(), b.end(), allowed);
    if (n_banned >= n_allowed) {
      static const std::vector<int32_t> none;
      ban = &none;
    }
  }
  row_.assign(row, row + vocab_);
  apply_mask(row_.data(), mask_.data(), vocab_);
  return {row_.data(), ban};
}

TokenConstraint::Step GrammarGate::accept(int32_t id) {
  if (!active_) {
    if (id == after_token_) active_ = true;
    return Step::Ok;
  }
  if (!m_.accept(id)) return Step::Rejected;
  return m_.is_terminated() ? Step::Terminated : Step::Ok;
}

}  // namespace cm::runtime
