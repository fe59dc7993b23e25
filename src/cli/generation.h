// The CLI's `generate` and `chat` run their jobs through the same runtime::Engine as the server,
// on the calling thread (Engine::generate), one sequence at a time; this is the little they add:
// the engine for one slot, and a job's events gathered into what the commands print.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/engine.h"

namespace cm::cli {

struct Generation {
  std::vector<int32_t> tokens;  // generated ids (a final EOS included)
  std::string text;             // released text (stop strings removed)
  std::string finish_reason;    // "stop", "length", "cancelled"
  int64_t prompt_tokens = 0, prompt_reused = 0;
  double prompt_seconds = 0, gen_seconds = 0;
  int64_t steps = 0;                    // engine steps that sampled (with --mtp fewer than tokens)
  int64_t drafted = 0, accepted = 0;    // MTP drafts proposed and accepted
};

// One slot, steps of 512 tokens, the context `ctx`; no request log lines. sample_on_device and
// mtp_draft: runtime::EngineOptions's.
std::unique_ptr<runtime::Engine> make_cli_engine(ModelBackend& be, const Tokenizer* tok, int64_t vocab, int64_t ctx,
                                                 std::vector<int32_t> eos_ids, bool sample_on_device,
                                                 int32_t mtp_draft = 0);

// Runs the job to its end; on_text gets each released piece. A job that fails throws cm::Error.
// max_tokens 0 generates nothing (the engine samples at least one token once the prompt is in).
Generation generate(runtime::Engine& e, runtime::JobSpec spec, const std::function<void(const std::string&)>& on_text,
                    const std::atomic<bool>* cancel = nullptr);

}  // namespace cm::cli
