// Structured output in the engine: one GrammarGate per job that asked for a grammar. Before each
// sampling of the job's row it masks every token the grammar forbids (grammar/grammar.h, over
// XGrammar); after it, the sampled token advances the matcher. The sampler (a lower floor) knows
// nothing of grammars: it gets a masked copy of the row.
//
// Rules the gate keeps:
//   - the matcher's stop ids are the engine's EOS set: an end id is allowed only where the grammar
//     is complete, and the job ends ("stop") when the matcher accepts it (is_terminated);
//   - min_tokens bans end ids while the mask leaves another token; when the grammar allows nothing
//     but an end id, the grammar wins (no deadlock, no "every logit is -inf" error);
//   - after_token (thinking mode: the </think> id): the grammar starts after that token; before it
//     the output is free except that end ids are banned, so the answer cannot end before its
//     structured part.
// Speculative decoding can undo accepted tokens through Matcher::rollback (not used yet).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "grammar/grammar.h"
#include "runtime/token_constraint.h"

namespace cm::runtime {

// What a JobSpec carries (as its constraint): the compiled grammar and the compiler that makes
// its matcher (one per server; the logits width is its vocabulary).
struct JobGrammar : TokenConstraintFactory {
  std::shared_ptr<GrammarCompiler> compiler;
  std::shared_ptr<const CompiledGrammar> grammar;
  int32_t after_token = -1;  // -1: the grammar applies from the first generated token
  std::unique_ptr<TokenConstraint> make(int64_t vocab, const std::vector<int32_t>& end_ids) const override;
};

class GrammarGate : public TokenConstraint {
 public:
  // vocab: the logits row width (must be the compiler's). end_ids: the ids that end a sequence.
  // cm::Error when the widths differ.
  GrammarGate(const JobGrammar& g, int64_t vocab, std::vector<int32_t> end_ids);

  Constrained constrain(const float* row, const std::vector<int32_t>& banned) override;
  Step accept(int32_t id) override;
  bool active() const { return active_; }

 private:
  Matcher m_;
  int64_t vocab_;
  int32_t after_token_;
  bool active_;
  std::vector<int32_t> end_ids_;
  std::vector<uint32_t> mask_;
  std::vector<float> row_;
  std::vector<int32_t> banned_;
};

}  // namespace cm::runtime
