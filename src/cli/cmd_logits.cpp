// `clawmine logits --model DIR --tokens 5,17,42 [--chunk N] --out FILE`
// Feeds the tokens N at a time (default: all at once) and writes a
// safetensors file with one F32 tensor `logits` [tokens, vocab].
#include <cstdio>
#include <memory>

#include "cli/cli_util.h"
#include "cli/commands.h"
#include "cli/engine_options.h"
#include "common/error.h"
#include "io/output_file.h"
#include "io/safetensors.h"
#include "model/model.h"

namespace {

struct Opts {
  cm::cli::EngineOptions eng;
  std::string tokens, out;
  int64_t chunk = 0;
};

int run(Opts& o) {
  std::vector<int32_t> toks = cm::cli::parse_token_list(o.tokens);
  if (o.chunk < 0) cm::fail("--chunk must be >= 1 (got {})", o.chunk);
  auto m = cm::cli::load_model(o.eng);
  cm::check_output_path(o.out, {o.eng.model});  // before the forward: a bad -o fails fast
  cm::State st = cm::state_new(m->config);
  cm::LayerStatsObserver stats(stderr);
  cm::ForwardOptions fo = cm::cli::forward_options(o.eng, &stats);
  fo.all_logits = true;
  const int64_t n = int64_t(toks.size()), V = m->config.vocab_size;
  const int64_t chunk = o.chunk > 0 ? o.chunk : n;
  std::vector<float> logits;
  logits.reserve(size_t(n * V));
  for (int64_t i = 0; i < n; i += chunk) {
    int64_t len = std::min(chunk, n - i);
    std::vector<float> l = cm::forward(*m, st, toks.data() + i, len, fo);
    logits.insert(logits.end(), l.begin(), l.end());
  }
  cm::write_safetensors(o.out, {cm::tensor_f32("logits", {n, V}, logits.data())}, {}, {o.eng.model});
  std::fprintf(stderr, "wrote logits [%lld, %lld] to %s\n", (long long)n, (long long)V, o.out.c_str());
  return 0;
}

cm::cli::CommandRegistrar reg({"logits", "Compute logits for a token sequence and write them as safetensors",
                               [](CLI::App& app) -> cm::cli::CommandRun {
                                 auto o = std::make_shared<Opts>();
                                 cm::cli::add_engine_options(app, o->eng);
                                 app.add_option("--tokens", o->tokens, "Comma-separated token ids")->required();
                                 app.add_option("--chunk", o->chunk, "Feed N tokens per forward call (default all)");
                                 app.add_option("-o,--out", o->out, "Output .safetensors file")->required();
                                 return [o] { return run(*o); };
                               }});

}  // namespace
