// `clawmine generate [-m DIR] (-p TEXT | --tokens 5,17,42) -n 64 [--chat] [--think]
//   [--system S] [--stop STR ...] [sampling flags]`
// Text mode (-p) tokenizes the prompt (raw, or rendered with the DeepSeek-V4
// chat format with --chat/--think), streams the generated text to stdout and
// prints prompt and generation speed on stderr. Token mode (--tokens) prints
// the generated ids. Both stop at EOS unless --ignore-eos.
#include <cstdio>
#include <memory>

#include "chat/dsv4.h"
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "cli/engine_options.h"
#include "cli/text_output.h"
#include "common/error.h"
#include "runtime/session.h"
#include "sampling/generation_config.h"

namespace {

struct Opts {
  cm::cli::EngineOptions eng;
  std::string prompt, tokens, system;
  int64_t n_predict = 64;
  cm::SamplingParams sp;
  std::vector<std::string> stop;
  CLI::App* app = nullptr;  // to ask which sampling flags were given
  bool ignore_eos = false, chat = false, think = false, hide_reasoning = false;
};

void print_speed(const cm::GenerateResult& r) {
  const double n = double(r.tokens.size());
  std::fprintf(stderr, "\nprompt: %lld tokens, %.1f tok/s | generation: %lld tokens, %.1f tok/s\n",
               (long long)(r.prompt_tokens - r.prompt_reused),
               r.prompt_seconds > 0 ? double(r.prompt_tokens - r.prompt_reused) / r.prompt_seconds : 0.0,
               (long long)r.tokens.size(), r.gen_seconds > 0 ? n / r.gen_seconds : 0.0);
}

int run(Opts& o) {
  if (o.prompt.empty() == o.tokens.empty()) cm::fail("give exactly one of -p/--prompt and --tokens");
  if (o.n_predict < 0) cm::fail("-n must be >= 0 (got {})", o.n_predict);
  if ((o.chat || o.think || !o.system.empty()) && o.prompt.empty())
    cm::fail("--chat, --think and --system need a text prompt (-p)");
  cm::validate_sampling_params(o.sp);  // before the model loads
  auto m = cm::cli::load_model(o.eng);
  // generation_config.json supplies the defaults; flags given on the command line win.
  cm::GenerationDefaults gd = cm::load_generation_config(o.eng.model);
  cm::SamplingParams sp = cm::cli::effective_sampling(*o.app, o.sp, o.eng.model);
  cm::LayerStatsObserver stats(stderr);
  cm::GenerateRequest req;
  req.max_tokens = o.n_predict;
  req.sampling = sp;
  req.stop = o.stop;
  req.eos_ids = gd.eos_ids;
  req.ignore_eos = o.ignore_eos;

  auto be = cm::cli::make_backend(o.eng, *m, &stats, cm::CacheShape{1, 512, 0});
  if (!o.tokens.empty()) {
    cm::Session s(*be, m->config, nullptr);
    req.prompt = cm::cli::parse_token_list(o.tokens);
    cm::GenerateResult r = s.generate(req, nullptr);
    for (size_t i = 0; i < r.tokens.size(); ++i) std::printf(i ? " %d" : "%d", r.tokens[i]);
    std::printf("\n");
    std::fflush(stdout);
    print_speed(r);
    return 0;
  }

  cm::Tokenizer tok = cm::Tokenizer::load(o.eng.model);
  cm::Session s(*be, m->config, &tok);
  const bool chat = o.chat || o.think || !o.system.empty();
  const auto mode = o.think ? cm::chat::Mode::Thinking : cm::chat::Mode::Chat;
  std::string text = o.prompt;
  if (chat) {
    nlohmann::ordered_json msgs = nlohmann::ordered_json::array();
    if (!o.system.empty()) msgs.push_back({{"role", "system"}, {"content", o.system}});
    msgs.push_back({{"role", "user"}, {"content", o.prompt}});
    text = cm::chat::encode_messages(msgs, cm::chat::ChatOptions{mode, true, true, ""});
  }
  req.prompt = tok.encode(text);
  if (req.prompt.empty()) cm::fail("the prompt encodes to no tokens");
  cm::cli::TextPrinter out(chat ? mode : cm::chat::Mode::Chat, o.hide_reasoning);
  if (!chat) std::fputs(o.prompt.c_str(), stdout);
  cm::GenerateResult r = s.generate(req, [&](const std::string& piece) { out.push(piece); });
  out.finish();
  std::printf("\n");
  std::fflush(stdout);
  print_speed(r);
  return 0;
}

cm::cli::CommandRegistrar reg(
    {"generate", "Generate text (-p) or token ids (--tokens) from a prompt", [](CLI::App& app) -> cm::cli::CommandRun {
       auto o = std::make_shared<Opts>();
       o->app = &app;
       cm::cli::add_engine_options(app, o->eng, /*model_required=*/false);
       app.add_option("-p,--prompt", o->prompt, "Prompt text");
       app.add_option("--tokens", o->tokens, "Prompt as comma-separated token ids (prints ids)");
       app.add_option("-n,--n-predict", o->n_predict, "Tokens to generate (64)");
       app.add_flag("--chat", o->chat, "Render the prompt as a user turn with the DeepSeek-V4 chat format");
       app.add_flag("--think", o->think, "Chat in thinking mode (<think>); implies --chat");
       app.add_option("--system", o->system, "System prompt (implies --chat)");
       app.add_flag("--hide-reasoning", o->hide_reasoning, "Do not print the reasoning of thinking mode");
       app.add_option("--stop", o->stop, "Stop before this string (repeatable)")->take_all();
       cm::cli::add_sampling_options(app, o->sp);
       app.add_flag("--ignore-eos", o->ignore_eos, "Do not stop at EOS");
       return [o] { return run(*o); };
     }});

}  // namespace
