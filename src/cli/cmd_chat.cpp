// `clawmine chat [-m DIR] [--think] [--system S] [--hide-reasoning] [-n N] [sampling flags]`
// An interactive multi-turn REPL with the DeepSeek-V4 chat format. The
// history is kept (and the model state reused when the new prompt extends
// it); reasoning is shown dimmed on a terminal or hidden with
// --hide-reasoning; Ctrl-C stops the current answer, not the program
// (Ctrl-C at the prompt, Ctrl-D or /exit quit; /reset clears the history).
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
#include "runtime/session.h"
#include "sampling/generation_config.h"

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
  int64_t n_predict = 512;
  cm::SamplingParams sp;
  CLI::App* app = nullptr;
  bool think = false, hide_reasoning = false;
};

int run(Opts& o) {
  cm::validate_sampling_params(o.sp);
  auto m = cm::cli::load_model(o.eng);
  const cm::SamplingParams sp = cm::cli::effective_sampling(*o.app, o.sp, o.eng.model);
  const std::vector<int32_t> extra_eos = cm::load_generation_config(o.eng.model).eos_ids;
  cm::Tokenizer tok = cm::Tokenizer::load(o.eng.model);
  cm::LayerStatsObserver stats(stderr);
  auto be = cm::cli::make_backend(o.eng, *m, &stats, cm::CacheShape{1, 512, 0});
  cm::Session session(*be, m->config, &tok);
  const auto mode = o.think ? cm::chat::Mode::Thinking : cm::chat::Mode::Chat;
  const bool tty = ::isatty(STDOUT_FILENO);
  nlohmann::ordered_json history = nlohmann::ordered_json::array();
  if (!o.system.empty()) history.push_back({{"role", "system"}, {"content", o.system}});
  std::signal(SIGINT, on_sigint);
  std::fprintf(stderr, "clawmine chat: %s (%s mode). /reset clears the history, /exit or Ctrl-D quits.\n",
               o.eng.model.c_str(), o.think ? "thinking" : "chat");
  std::string line;
  while (true) {
    std::fputs(tty ? "\x1b[1m> \x1b[0m" : "> ", stdout);
    std::fflush(stdout);
    if (!std::getline(std::cin, line)) break;
    if (line == "/exit" || line == "/quit") break;
    if (line == "/reset") {
      history.erase(history.begin() + (o.system.empty() ? 0 : 1), history.end());
      session.reset();
      continue;
    }
    if (line.empty()) continue;
    history.push_back({{"role", "user"}, {"content", line}});
    cm::GenerateRequest req;
    req.prompt = tok.encode(cm::chat::encode_messages(history, cm::chat::ChatOptions{mode, true, true, ""}));
    req.max_tokens = o.n_predict;
    req.sampling = sp;
    req.eos_ids = extra_eos;
    if (int64_t(req.prompt.size()) + 1 >= m->config.max_position_embeddings) {
      std::fprintf(stderr, "the conversation no longer fits the context (%lld tokens); /reset to start over\n",
                   (long long)m->config.max_position_embeddings);
      history.erase(history.end() - 1);
      continue;
    }
    cm::cli::TextPrinter out(mode, o.hide_reasoning);
    g_cancel.store(false);
    g_generating.store(true);
    cm::GenerateResult r = session.generate(req, [&](const std::string& p) { out.push(p); }, &g_cancel);
    g_generating.store(false);
    out.finish();
    std::fputs(r.finish_reason == "cancelled" ? " [stopped]\n" : "\n", stdout);
    std::fflush(stdout);
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
                                 cm::cli::add_engine_options(app, o->eng, /*model_required=*/false);
                                 app.add_flag("--think", o->think, "Thinking mode (<think>)");
                                 app.add_option("--system", o->system, "System prompt");
                                 app.add_flag("--hide-reasoning", o->hide_reasoning, "Hide the reasoning");
                                 app.add_option("-n,--n-predict", o->n_predict, "Max tokens per answer (512)");
                                 cm::cli::add_sampling_options(app, o->sp);
                                 return [o] { return run(*o); };
                               }});

}  // namespace
