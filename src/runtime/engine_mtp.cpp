// The engine's speculative decoding with the model's MTP block (engine.h's header comment): the
// drafts before a step, the verification of a speculating sequence's rows after it.
#include <algorithm>
#include <string>

#include "common/error.h"
#include "runtime/engine.h"
#include "runtime/engine_seq.h"

namespace cm::runtime {

void Engine::make_drafts() {
  const int64_t K = opt_.mtp_draft;
  int64_t decoding = 0;
  for (const auto& s : running_) decoding += !s->prefilling();
  // One token of the step per decoding sequence is its own; drafts take from what is left, in
  // admission order, ahead of the prefill chunks.
  int64_t budget = int64_t(opt_.max_step_tokens) - decoding;
  std::vector<std::vector<Seq*>> by_k(size_t(K + 1));
  for (const auto& sp : running_) {
    Seq& s = *sp;
    s.drafts.clear();
    if (s.prefilling() || s.constraint) continue;  // a grammar's tokens are drawn one at a time
    const int64_t P = int64_t(slots_[size_t(s.slot)].held.size());  // where s.pending goes
    // The run [pending, drafts] stays inside the context, yields at most the tokens the job may still
    // emit, and fits what a rollback can undo.
    const int64_t k = std::min<int64_t>({K, budget, opt_.ctx - 1 - P, s.job->spec.max_tokens - s.generated - 1,
                                         be_.undo_token_limit() - 1});
    if (k <= 0) continue;
    budget -= k;
    by_k[size_t(k)].push_back(&s);
  }
  std::vector<int32_t> slot, token, out;
  std::vector<SampleParams> params;
  std::vector<std::pair<Seq*, std::string>> failed;
  for (int64_t k = 1; k <= K; ++k) {
    const std::vector<Seq*>& group = by_k[size_t(k)];
    if (group.empty()) continue;
    slot.clear(), token.clear(), params.clear();
    for (Seq* s : group) {
      slot.push_back(s->slot);
      token.push_back(s->pending);
      // Draft j proposes the token drawn at counter hist.size() + j: the same draw as its target's.
      params.push_back(s->sampler.params(int64_t(s->hist.size())));
    }
    out.assign(group.size() * size_t(k), -1);
    DraftRequest r;
    r.n = int32_t(group.size());
    r.slot = slot.data();
    r.token = token.data();
    r.params = params.data();
    r.k = int32_t(k);
    r.out = out.data();
    try {
      be_.draft(r);
    } catch (const std::exception& e) {
      // A draft that fails (a non-finite MTP block) ends its jobs: a broken checkpoint is an error.
      for (Seq* s : group) failed.emplace_back(s, std::string("mtp: ") + e.what());
      continue;
    }
    for (size_t i = 0; i < group.size(); ++i)
      group[i]->drafts.assign(out.begin() + long(i * size_t(k)), out.begin() + long((i + 1) * size_t(k)));
  }
  for (auto& [s, what] : failed) finish(*s, "error", false, what);
}

void Engine::verify(Seq& s, const float* rows, const int32_t* tokens, const TokenOut* lps) {
  const std::vector<int32_t> d = std::move(s.drafts);
  s.drafts.clear();
  const int64_t k = int64_t(d.size());
  const int32_t slot = s.slot;
  std::vector<int32_t>& held = slots_[size_t(slot)].held;
  const int64_t P = int64_t(held.size()) - 1 - k;  // the position of the run's first token
  int64_t acc = 0;
  bool alive = true;
  for (int64_t j = 0; j <= k; ++j) {
    // Drawn as a plain decode step would: the job's sampler at counter hist.size(), penalties and
    // banned ids over every token so far (the drafts accepted before this row included).
    const bool more = rows ? on_logits(s, rows + j * vocab_)
                           : (++spec_.emitted, on_token(s, tokens[j], nullptr, lps ? lps + j : nullptr));
    if (!more) {  // the job ended (s is gone)
      alive = false;
      break;
    }
    if (j == k || s.pending != d[size_t(j)]) break;
    ++acc;  // the token drawn is draft j, already in the slot: row j + 1 follows from it
  }
  // The slot keeps the run's first token and the accepted drafts.
  held.resize(size_t(P + 1 + acc));
  try {
    be_.rollback_slot(slot, P + 1 + acc);
  } catch (const std::exception& e) {
    // Cannot happen for a run this engine booked; a slot in doubt is emptied rather than trusted.
    held.clear();
    be_.reset_slot(slot);
    if (alive) finish(s, "error", false, std::string("mtp: ") + e.what());
  }
  ++spec_.rounds;
  spec_.drafted += k;
  spec_.accepted += acc;
  for (int64_t j = 0; j < acc; ++j) ++spec_.accepted_at[j];
  if (metrics_) metrics_->spec_decode(k, acc);
}

}  // namespace cm::runtime
