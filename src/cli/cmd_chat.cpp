// `clawmine chat [-m DIR] [--think] [--system S] [--hide-reasoning] [-n N] [-c CTX] [--verbose] [sampling flags]`
// An interactive multi-turn REPL with the DeepSeek-V4 chat format. The
// history is kept (and the model state reused when the new prompt extends
// it); reasoning is shown dimmed on a terminal or hidden with
// --hide-reasoning; Ctrl-C stops the current answer, not the program
// (Ctrl-C at the prompt, Ctrl-D or /exit quit). Lines starting with '/' are
// commands (/help, /reset, /exit), never sent to the model; an unknown one is
// refused. An answer cut at -n or at the context says so; --verbose prints the
// speed after each answer.
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <memory>

#include "chat/dsv4.h"
#include "cli/commands.h"
#include "cli/engine_options.h"
#include "cli/text_output.h"
#include "common/error.h"
#include "cli/generation.h"
#include "runtime/stop_rule.h"
#include "sampling/generation_config.h"
#include "runtime/layer_stats.h"
#include "factory/factory.h"

namespace {

std::atomic<bool> g_cancel{false};
std::atomic<bool> g_generating{false};

void on_sigint(int) {
  if (g_generating.load()) {
    g_cancel.store(true);
  } else {
    const char nl = '\n';
    (void)!::write(STDOUT_FILENO, &nl, 1);
    ::_exit(0);
  }
}

struct Opts {
  cm::cli::EngineOptions eng;
  std::string system;
  int64_t n_predict = 512, ctx = 0, seed = -1;
  cm::SamplingParams sp;
  CLI::App* app = nullptr;
  bool think = false, hide_reasoning = false, verbose = false;
};

const char* kChatHelp =
    "commands:\n"
    "  /help           this list\n"
    "  /reset          forget the conversation (the system prompt stays)\n"
    "  /exit, /quit    leave (Ctrl-D too; Ctrl-C stops an answer, or leaves at the prompt)\n";

int run(Opts& o) {
  if (o.n_predict < 1) cm::fail("-n must be >= 1 (got {})", o.n_predict);
  if (o.ctx < 0) cm::fail("-c/--ctx-size must be >= 1, or 0 for the model's context (got {})", o.ctx);
  cm::cli::check_seed(o.seed);
  cm::validate_sampling_params(o.sp);
  auto m = cm::cli::load_model(o.eng);
  const int64_t model_ctx = m->config.max_position_embeddings;
  if (o.ctx > model_ctx) cm::fail("-c/--ctx-size {} exceeds the model's context of {} tokens", o.ctx, model_ctx);
  const int64_t ctx = o.ctx > 0 ? o.ctx : model_ctx;
  const cm::SamplingParams sp = cm::cli::effective_sampling(*o.app, o.sp, o.seed, o.eng.model);
  const cm::GenerationDefaults gd = cm::load_generation_config(o.eng.model);
  cm::Tokenizer tok = cm::Tokenizer::load(o.eng.model);
  cm::LayerStatsObserver stats(stderr);
  o.eng.ctx_size = ctx;
  auto be = cm::cli::make_backend(o.eng, *m, &stats, cm::CacheShape{1, 512, 0});
  auto engine = cm::cli::make_cli_engine(*be, &tok, m->config.vocab_size, ctx,
                                         cm::runtime::end_of_sequence_ids(m->config, &tok, gd), o.eng.sample_on_device,
                                         o.eng.mtp);
  const auto mode = o.think ? cm::chat::Mode::Thinking : cm::chat::Mode::Chat;
  const bool tty = ::isatty(STDOUT_FILENO);
  nlohmann::ordered_json history = nlohmann::ordered_json::array();
  if (!o.system.empty()) history.push_back({{"role", "system"}, {"content", o.system}});
  std::signal(SIGINT, on_sigint);
  std::fprintf(stderr,
               "clawmine chat: %s (%s mode, context %lld, seed %llu). /help lists the commands, /exit or Ctrl-D "
               "quits.\n",
               o.eng.model.c_str(), o.think ? "thinking" : "chat", (long long)ctx, (unsigned long long)sp.seed);
  std::string line;
  while (true) {
    std::fputs(tty ? "\x1b[1m> \x1b[0m" : "> ", stdout);
    std::fflush(stdout);
    if (!std::getline(std::cin, line)) break;
    if (line == "/exit" || line == "/quit") break;
    if (line == "/reset") {
      history.erase(history.begin() + (o.system.empty() ? 0 : 1), history.end());
      engine->drop_cached_prefixes();
      std::fputs(o.system.empty() ? "history cleared\n" : "history cleared (the system prompt stays)\n", stdout);
      continue;
    }
    if (line == "/help" || line == "/?") {
      std::fputs(kChatHelp, stdout);
      continue;
    }
    if (!line.empty() && line[0] == '/') {
      std::string cmd = line.substr(0, line.find(' '));
      std::fprintf(stdout, "unknown command %s (not sent to the model); /help lists the commands\n", cmd.c_str());
      continue;
    }
    if (line.empty()) continue;
    history.push_back({{"role", "user"}, {"content", line}});
    cm::runtime::JobSpec req;
    req.id = "chat";
    req.prompt = tok.encode(cm::chat::encode_messages(history, cm::chat::ChatOptions{mode, true, true, ""}));
    req.sampling = sp;
    req.release_held_on_cancel = true;
    if (int64_t(req.prompt.size()) + 1 >= ctx) {
      std::fprintf(stderr, "the conversation (%lld tokens) no longer fits the context (%lld tokens); /reset to start over\n",
                   (long long)req.prompt.size(), (long long)ctx);
      history.erase(history.end() - 1);
      continue;
    }
    req.max_tokens = std::min(o.n_predict, ctx - int64_t(req.prompt.size()));
    cm::cli::TextPrinter out(mode, o.hide_reasoning);
    g_cancel.store(false);
    g_generating.store(true);
    cm::cli::Generation r = cm::cli::generate(*engine, req, [&](const std::string& p) { out.push(p); }, &g_cancel);
    g_generating.store(false);
    out.finish();
    const int64_t used = r.prompt_tokens + int64_t(r.tokens.size());
    if (r.finish_reason == "cancelled") std::fputs(" [stopped]\n", stdout);
    else if (r.finish_reason == "length" && int64_t(r.tokens.size()) >= o.n_predict)
      std::fprintf(stdout, " [cut: -n %lld tokens reached]\n", (long long)o.n_predict);
    else if (r.finish_reason == "length" && used >= ctx)
      std::fprintf(stdout, " [cut: the context of %lld tokens is full; /reset to start over]\n", (long long)ctx);
    else std::fputs("\n", stdout);
    std::fflush(stdout);
    if (o.verbose)
      std::fprintf(stderr, "[prompt: %lld new tokens (%lld reused), %.1f tok/s | answer: %lld tokens, %.1f tok/s | context %lld/%lld]\n",
                   (long long)(r.prompt_tokens - r.prompt_reused), (long long)r.prompt_reused,
                   r.prompt_seconds > 0 ? double(r.prompt_tokens - r.prompt_reused) / r.prompt_seconds : 0.0,
                   (long long)r.tokens.size(), r.gen_seconds > 0 ? double(r.tokens.size()) / r.gen_seconds : 0.0,
                   (long long)used, (long long)ctx);
    if (o.verbose && o.eng.mtp > 0)
      std::fprintf(stderr, "[mtp: %lld of %lld drafts accepted, %.2f tokens per step]\n", (long long)r.accepted,
                   (long long)r.drafted, r.steps > 0 ? double(r.tokens.size()) / double(r.steps) : 0.0);
    std::string done = r.text;
    if (mode == cm::chat::Mode::Thinking && done.find(cm::chat::kThinkEnd) == std::string::npos)
      done += cm::chat::kThinkEnd;  // an interrupted answer: keep what was said as reasoning
    history.push_back(cm::chat::to_message(
        cm::chat::parse_completion_lenient(done + std::string(cm::chat::kEos), mode)));
  }
  return 0;
}

cm::cli::CommandRegistrar reg({"chat", "Interactive multi-turn chat with the DeepSeek-V4 chat format",
                               [](CLI::App& app) -> cm::cli::CommandRun {
                                 auto o = std::make_shared<Opts>();
                                 o->app = &app;
                                 cm::cli::add_engine_options(app, o->eng);
                                 cm::cli::add_mtp_option(app, o->eng);
                                 app.add_flag("--think", o->think, "Thinking mode (<think>)");
                                 app.add_option("--system", o->system, "System prompt");
                                 app.add_flag("--hide-reasoning", o->hide_reasoning, "Hide the reasoning");
                                 app.add_option("-n,--n-predict", o->n_predict, "Max tokens per answer (512)");
                                 app.add_option("-c,--ctx-size", o->ctx,
                                                "Context size in tokens for the whole conversation (0 = the "
                                                "model's, the default)");
                                 app.add_flag("--verbose", o->verbose, "Print the speed after each answer (stderr)");
                                 cm::cli::add_sampling_options(app, o->sp, o->seed);
                                 return [o] { return run(*o); };
                               }});

}  // namespace
