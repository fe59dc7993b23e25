// `clawmine generate --model DIR --tokens 5,17,42 -n 32 [sampling flags]`
// Prefills the prompt, then samples one token at a time and prints each id
// as it is produced (space-separated), stopping at EOS unless --ignore-eos.
// Speed (prompt and generation tokens/s) goes to stderr at the end.
#include <chrono>
#include <cstdio>
#include <memory>

#include "cli/cli_util.h"
#include "cli/commands.h"
#include "cli/engine_options.h"
#include "common/error.h"
#include "model/model.h"
#include "sampling/sampler.h"

namespace {

struct Opts {
  cm::cli::EngineOptions eng;
  std::string tokens;
  int64_t n_predict = 32;
  cm::SamplingParams sp;
  bool ignore_eos = false;
};

int run(const Opts& o) {
  std::vector<int32_t> prompt = cm::cli::parse_token_list(o.tokens);
  if (o.n_predict < 0) cm::fail("-n must be >= 0 (got {})", o.n_predict);
  cm::Sampler sampler(o.sp);  // validates the sampling flags before the model loads
  auto t0 = std::chrono::steady_clock::now();
  auto m = cm::cli::load_model(o.eng);
  const cm::Config& c = m->config;
  if (int64_t(prompt.size()) + o.n_predict > c.max_position_embeddings)
    cm::fail("prompt ({} tokens) + -n {} exceeds the model's context of {}", prompt.size(), o.n_predict,
             c.max_position_embeddings);
  cm::State st = cm::state_new(c);
  cm::LayerStatsObserver stats(stderr);
  cm::ForwardOptions fo = cm::cli::forward_options(o.eng, &stats);
  auto t1 = std::chrono::steady_clock::now();
  std::vector<float> logits = cm::forward(*m, st, prompt.data(), int64_t(prompt.size()), fo);
  auto t2 = std::chrono::steady_clock::now();
  std::vector<int32_t> hist = prompt;
  int64_t produced = 0;
  for (; produced < o.n_predict; ++produced) {
    int32_t id = sampler.sample(logits.data(), c.vocab_size, hist);
    hist.push_back(id);
    std::printf(produced ? " %d" : "%d", id);
    std::fflush(stdout);
    bool eos = false;
    for (int64_t e : c.eos_token_ids) eos |= (e == id);
    if (eos && !o.ignore_eos) {
      ++produced;
      break;
    }
    if (produced + 1 < o.n_predict) logits = cm::forward(*m, st, &id, 1, fo);
  }
  std::printf("\n");
  std::fflush(stdout);
  auto t3 = std::chrono::steady_clock::now();
  auto sec = [](auto a, auto b) { return std::chrono::duration<double>(b - a).count(); };
  std::fprintf(stderr, "load %.2f s | prompt %zu tokens %.1f tok/s | generated %lld tokens %.1f tok/s\n", sec(t0, t1),
               prompt.size(), double(prompt.size()) / sec(t1, t2), (long long)produced,
               produced > 1 ? double(produced - 1) / sec(t2, t3) : 0.0);
  return 0;
}

cm::cli::CommandRegistrar reg({"generate", "Generate token ids from a prompt of token ids",
                               [](CLI::App& app) -> cm::cli::CommandRun {
                                 auto o = std::make_shared<Opts>();
                                 cm::cli::add_engine_options(app, o->eng);
                                 app.add_option("--tokens", o->tokens, "Prompt as comma-separated token ids")
                                     ->required();
                                 app.add_option("-n,--n-predict", o->n_predict, "Tokens to generate (32)");
                                 app.add_option("--temp", o->sp.temperature, "Temperature (0 = greedy)");
                                 app.add_option("--top-k", o->sp.top_k, "Top-k (0 = off)");
                                 app.add_option("--top-p", o->sp.top_p, "Top-p (1 = off)");
                                 app.add_option("--min-p", o->sp.min_p, "Min-p (0 = off)");
                                 app.add_option("--repeat-penalty", o->sp.repetition_penalty, "Repetition penalty");
                                 app.add_option("--presence-penalty", o->sp.presence_penalty, "Presence penalty");
                                 app.add_option("--frequency-penalty", o->sp.frequency_penalty, "Frequency penalty");
                                 app.add_option("-s,--seed", o->sp.seed, "Random seed");
                                 app.add_flag("--ignore-eos", o->ignore_eos, "Do not stop at EOS");
                                 return [o] { return run(*o); };
                               }});

}  // namespace
