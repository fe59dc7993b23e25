// What the engine asks of a constrained job (structured output), without naming the grammar
// module: runtime/grammar_gate.h implements it over grammar/ (XGrammar). The engine sees only this
// interface, so builds without XGrammar (the device build) still link the engine.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

namespace cm::runtime {

// One job's constraint state; made when the job is admitted, used only by the engine thread.
class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // The row to sample from (row itself, or a masked copy the constraint owns) and the ids the
  // sampler must still ban (`banned` — the stop rule's — or a list the constraint owns).
  struct Constrained {
    const float* row;
    const std::vector<int32_t>* banned;
  };
  virtual Constrained constrain(const float* row, const std::vector<int32_t>& banned) = 0;
  enum class Step { Ok, Rejected, Terminated };
  // Advances by the sampled token. Rejected: not allowed (a bug upstream); Terminated: an end id
  // completed the constraint and the job is over ("stop").
  virtual Step accept(int32_t id) = 0;
};

// What a JobSpec carries: makes the per-job state. Shared by the HTTP thread and the engine.
class TokenConstraintFactory {
 public:
  virtual ~TokenConstraintFactory() = default;
  // vocab: the logits row width; end_ids: the ids that end a sequence. cm::Error when unusable.
  virtual std::unique_ptr<TokenConstraint> make(int64_t vocab, const std::vector<int32_t>& end_ids) const = 0;
};

}  // namespace cm::runtime
