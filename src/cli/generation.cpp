// See generation.h.
#include "cli/generation.h"

#include <chrono>

#include "common/error.h"

namespace cm::cli {

std::unique_ptr<runtime::Engine> make_cli_engine(ModelBackend& be, const Tokenizer* tok, int64_t vocab, int64_t ctx,
                                                 std::vector<int32_t> eos_ids, bool sample_on_device,
                                                 int32_t mtp_draft) {
  runtime::EngineOptions o;
  o.sample_on_device = sample_on_device;
  o.mtp_draft = mtp_draft;
  o.max_seqs = 1;
  o.max_step_tokens = 512;
  o.ctx = ctx;
  o.eos_ids = std::move(eos_ids);
  return std::make_unique<runtime::Engine>(be, tok, vocab, std::move(o), nullptr);
}

Generation generate(runtime::Engine& e, runtime::JobSpec spec, const std::function<void(const std::string&)>& on_text,
                    const std::atomic<bool>* cancel) {
  using Clock = std::chrono::steady_clock;
  Generation g;
  g.prompt_tokens = int64_t(spec.prompt.size());
  if (spec.max_tokens <= 0) {
    g.finish_reason = "length";
    return g;
  }
  const auto t0 = Clock::now();
  auto t1 = t0;  // the first token: the prompt is in
  const runtime::SpecStats before = e.spec_stats();
  runtime::JobEvent fin = e.generate(std::move(spec), [&](const runtime::JobEvent& ev) {
    if (g.tokens.empty() && !ev.tokens.empty()) t1 = Clock::now();
    for (const runtime::TokenOut& t : ev.tokens) g.tokens.push_back(t.id);
    if (ev.text.empty()) return;
    g.text += ev.text;
    if (on_text) on_text(ev.text);
  }, cancel);
  if (fin.finish_reason == "error") fail("{}", fin.error);
  if (g.tokens.empty()) t1 = Clock::now();
  g.finish_reason = fin.finish_reason;
  g.prompt_reused = fin.cached_tokens;
  g.prompt_seconds = std::chrono::duration<double>(t1 - t0).count();
  g.gen_seconds = std::chrono::duration<double>(Clock::now() - t1).count();
  const runtime::SpecStats& after = e.spec_stats();
  g.drafted = after.drafted - before.drafted;
  g.accepted = after.accepted - before.accepted;
  g.steps = after.steps - before.steps;
  return g;
}

}  // namespace cm::cli
