// `clawmine generate [-m DIR] (-p TEXT | -f FILE | --tokens IDS | stdin) [-n N] [-c CTX] [--chat] [--think]
//   [--system S] [--stop STR ...] [sampling flags]`
// Text mode tokenizes the prompt (raw, or rendered with the DeepSeek-V4 chat
// format with --chat/--think), streams the generated text to stdout and
// prints load time, prompt and generation speed and the seed on stderr. -p
// processes escapes as llama-cli does (\n, \t, ...; --no-escape keeps them);
// -f reads a file's exact bytes (- = stdin); with neither, a prompt piped into
// stdin is read. Token mode (--tokens, ids separated by commas or spaces as
// `tokenize` prints them) prints the generated ids. Both stop at EOS unless
// --ignore-eos, at -n tokens (-1: no limit) and at the context (-c, at most
// the model's), which is said on stderr.
#include <unistd.h>

#include <cstdio>
#include <memory>

#include "chat/dsv4.h"
#include "cli/cli_util.h"
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

struct Opts {
  cm::cli::EngineOptions eng;
  std::string prompt, file, tokens, system;
  int64_t n_predict = 64, ctx = 0, seed = -1;
  cm::SamplingParams sp;
  std::vector<std::string> stop;
  CLI::App* app = nullptr;  // to ask which flags were given
  bool ignore_eos = false, chat = false, think = false, hide_reasoning = false;
  bool no_escape = false, no_display_prompt = false;
};

void print_stats(const cm::cli::Generation& r, const cm::cli::EngineOptions& eng, uint64_t seed) {
  const double n = double(r.tokens.size());
  const int64_t fed = r.prompt_tokens - r.prompt_reused;
  std::fprintf(stderr, "\nload: %.2f s | prompt: %lld tokens, %.1f tok/s | generation: %lld tokens, %.1f tok/s | threads: %d | seed: %llu\n",
               eng.load_seconds, (long long)fed, r.prompt_seconds > 0 ? double(fed) / r.prompt_seconds : 0.0,
               (long long)r.tokens.size(), r.gen_seconds > 0 ? n / r.gen_seconds : 0.0, eng.threads_used, (unsigned long long)seed);
  if (eng.mtp > 0)
    std::fprintf(stderr, "mtp: %lld of %lld drafts accepted (%.1f%%) | %.2f tokens per step over %lld steps\n",
                 (long long)r.accepted, (long long)r.drafted, r.drafted > 0 ? 100.0 * double(r.accepted) / double(r.drafted) : 0.0,
                 r.steps > 0 ? n / double(r.steps) : 0.0, (long long)r.steps);
}

// The prompt text from -p (escapes processed unless --no-escape), -f (a file
// or - for stdin) or, with neither, stdin when it is not a terminal.
std::string prompt_text(const Opts& o) {
  const bool p = o.app->count("--prompt") > 0, f = o.app->count("--file") > 0;
  if (p) return o.no_escape ? o.prompt : cm::cli::process_escapes(o.prompt);
  if (f) return cm::cli::read_text_file(o.file, "-f/--file");
  if (::isatty(STDIN_FILENO))
    cm::fail("no prompt: give -p TEXT, -f FILE (- for stdin) or --tokens IDS, or pipe the prompt into stdin");
  return cm::cli::read_text_file("-", "stdin");
}

int run(Opts& o) {
  const int sources = int(o.app->count("--prompt") + o.app->count("--file") + o.app->count("--tokens"));
  if (sources > 1) cm::fail("give one prompt: -p TEXT, -f FILE or --tokens IDS (got {})", sources);
  if (o.n_predict < -1) cm::fail("-n must be >= 0, or -1 for no limit (got {})", o.n_predict);
  if (o.ctx < 0) cm::fail("-c/--ctx-size must be >= 1, or 0 for the model's context (got {})", o.ctx);
  const bool token_mode = o.app->count("--tokens") > 0;
  if ((o.chat || o.think || !o.system.empty()) && token_mode)
    cm::fail("--chat, --think and --system need a text prompt (-p, -f or stdin)");
  cm::cli::check_seed(o.seed);
  cm::validate_sampling_params(o.sp);  // before the model loads
  const std::vector<int32_t> ids = token_mode ? cm::cli::parse_token_list(o.tokens) : std::vector<int32_t>{};
  const std::string prompt = token_mode ? std::string() : prompt_text(o);
  if (!token_mode && prompt.empty()) cm::fail("the prompt is empty");
  auto m = cm::cli::load_model(o.eng);
  const int64_t model_ctx = m->config.max_position_embeddings;
  if (o.ctx > model_ctx) cm::fail("-c/--ctx-size {} exceeds the model's context of {} tokens", o.ctx, model_ctx);
  const int64_t ctx = o.ctx > 0 ? o.ctx : model_ctx;
  // generation_config.json supplies the defaults; flags given on the command line win.
  cm::GenerationDefaults gd = cm::load_generation_config(o.eng.model);
  cm::SamplingParams sp = cm::cli::effective_sampling(*o.app, o.sp, o.seed, o.eng.model);
  cm::LayerStatsObserver stats(stderr);
  cm::runtime::JobSpec req;
  req.id = "generate";
  req.sampling = sp;
  req.stop = o.stop;
  req.ignore_eos = o.ignore_eos;
  // The prompt fits the context; generation stops at -n or where the context ends.
  auto limit = [&]() {
    const int64_t n = int64_t(req.prompt.size());
    if (n >= ctx) cm::fail("the prompt has {} tokens; the context (-c) holds {}, leaving no room to generate", n, ctx);
    req.max_tokens = o.n_predict < 0 ? ctx - n : std::min(o.n_predict, ctx - n);
  };
  auto context_note = [&](const cm::cli::Generation& r) {
    const bool cut = r.finish_reason == "length" && (o.n_predict < 0 || int64_t(r.tokens.size()) < o.n_predict) &&
                     r.prompt_tokens + int64_t(r.tokens.size()) >= ctx;
    if (cut)
      std::fprintf(stderr, "\ncontext limit reached: %lld tokens (-c %lld%s); generation stopped\n",
                   (long long)(r.prompt_tokens + int64_t(r.tokens.size())), (long long)ctx,
                   o.ctx > 0 ? "" : ", the model's context");
  };

  o.eng.ctx_size = ctx;
  auto be = cm::cli::make_backend(o.eng, *m, &stats, cm::CacheShape{1, 512, 0});
  if (token_mode) {
    auto engine = cm::cli::make_cli_engine(*be, nullptr, m->config.vocab_size, ctx,
                                           cm::runtime::end_of_sequence_ids(m->config, nullptr, gd),
                                           o.eng.sample_on_device, o.eng.mtp);
    req.prompt = ids;
    limit();
    cm::cli::Generation r = cm::cli::generate(*engine, req, nullptr);
    for (size_t i = 0; i < r.tokens.size(); ++i) std::printf(i ? " %d" : "%d", r.tokens[i]);
    std::printf("\n");
    std::fflush(stdout);
    context_note(r);
    print_stats(r, o.eng, sp.seed);
    return 0;
  }

  cm::Tokenizer tok = cm::Tokenizer::load(o.eng.model);
  auto engine = cm::cli::make_cli_engine(*be, &tok, m->config.vocab_size, ctx,
                                         cm::runtime::end_of_sequence_ids(m->config, &tok, gd), o.eng.sample_on_device,
                                         o.eng.mtp);
  const bool chat = o.chat || o.think || !o.system.empty();
  const auto mode = o.think ? cm::chat::Mode::Thinking : cm::chat::Mode::Chat;
  std::string text = prompt;
  if (chat) {
    nlohmann::ordered_json msgs = nlohmann::ordered_json::array();
    if (!o.system.empty()) msgs.push_back({{"role", "system"}, {"content", o.system}});
    msgs.push_back({{"role", "user"}, {"content", prompt}});
    text = cm::chat::encode_messages(msgs, cm::chat::ChatOptions{mode, true, true, ""});
  }
  req.prompt = tok.encode(text);
  if (req.prompt.empty()) cm::fail("the prompt encodes to no tokens");
  limit();
  cm::cli::TextPrinter out(chat ? mode : cm::chat::Mode::Chat, o.hide_reasoning);
  if (!chat && !o.no_display_prompt) std::fputs(prompt.c_str(), stdout);
  cm::cli::Generation r = cm::cli::generate(*engine, req, [&](const std::string& piece) { out.push(piece); });
  out.finish();
  std::printf("\n");
  std::fflush(stdout);
  context_note(r);
  print_stats(r, o.eng, sp.seed);
  return 0;
}

cm::cli::CommandRegistrar reg(
    {"generate", "Generate text (-p, -f, stdin) or token ids (--tokens) from a prompt",
     [](CLI::App& app) -> cm::cli::CommandRun {
       auto o = std::make_shared<Opts>();
       o->app = &app;
       cm::cli::add_engine_options(app, o->eng);
       cm::cli::add_mtp_option(app, o->eng);
       app.add_option("-p,--prompt", o->prompt, "Prompt text (escapes such as \\n and \\t are processed)");
       app.add_option("-f,--file", o->file, "Read the prompt from a file (its exact bytes; - = stdin)");
       app.add_option("--tokens", o->tokens, "Prompt as token ids, comma- or space-separated (prints ids)");
       app.add_flag("--no-escape", o->no_escape, "Do not process escapes in -p");
       app.add_flag("--no-display-prompt", o->no_display_prompt, "Do not print the prompt before the generated text");
       app.add_option("-n,--n-predict", o->n_predict, "Tokens to generate (64; -1 = until EOS or the context ends)");
       app.add_option("-c,--ctx-size", o->ctx, "Context size in tokens, prompt included (0 = the model's, the default)");
       app.add_flag("--chat", o->chat, "Render the prompt as a user turn with the DeepSeek-V4 chat format");
       app.add_flag("--think", o->think, "Chat in thinking mode (<think>); implies --chat");
       app.add_option("--system", o->system, "System prompt (implies --chat)");
       app.add_flag("--hide-reasoning", o->hide_reasoning, "Do not print the reasoning of thinking mode");
       app.add_option("--stop", o->stop, "Stop before this string (repeatable)")->take_all();
       cm::cli::add_sampling_options(app, o->sp, o->seed);
       app.add_flag("--ignore-eos", o->ignore_eos, "Do not stop at EOS");
       return [o] { return run(*o); };
     }});

}  // namespace
