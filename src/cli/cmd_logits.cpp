// `clawmine logits [-m DIR] --tokens 5,17,42 | --tokens - | --tokens-file F [--chunk N] --out FILE`
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
#include "seam/backend.h"
#include "model/model.h"
#include "runtime/layer_stats.h"
#include "factory/factory.h"

namespace {

struct Opts {
  cm::cli::EngineOptions eng;
  std::string tokens, tokens_file, out;
  int64_t chunk = 0;
};

int run(Opts& o) {
  std::vector<int32_t> toks = cm::cli::read_token_ids(o.tokens, o.tokens_file);
  if (o.chunk < 0) cm::fail("--chunk must be >= 1 (got {})", o.chunk);
  auto m = cm::cli::load_model(o.eng);
  cm::check_output_path(o.out, {o.eng.model});  // before the model runs: a bad -o fails fast
  cm::LayerStatsObserver stats(stderr);
  const int64_t n = int64_t(toks.size()), V = m->config.vocab_size;
  for (size_t i = 0; i < toks.size(); ++i)
    if (toks[i] >= V) cm::fail("token {} (at {}) is outside the model's vocabulary of {}", toks[i], i, V);
  if (n > m->config.max_position_embeddings)
    cm::fail("{} tokens exceed the model's context of {} (max_position_embeddings)", n,
             m->config.max_position_embeddings);
  const int64_t chunk = o.chunk > 0 ? std::min(o.chunk, n) : n;
  auto be = cm::cli::make_backend(o.eng, *m, &stats, cm::CacheShape{1, int32_t(chunk), n});
  std::vector<float> logits(size_t(n * V));
  std::vector<int32_t> pos(static_cast<size_t>(n)), slot(size_t(n), 0);
  std::vector<uint8_t> want(size_t(n), 1);
  for (int64_t i = 0; i < n; ++i) pos[size_t(i)] = int32_t(i);
  for (int64_t i = 0; i < n; i += chunk) {
    const int32_t len = int32_t(std::min(chunk, n - i));
    be->step(cm::Batch{len, toks.data() + i, pos.data() + i, slot.data(), want.data()}, logits.data() + i * V);
  }
  cm::write_safetensors(o.out, {cm::tensor_f32("logits", {n, V}, logits.data())}, {}, {o.eng.model});
  std::fprintf(stderr, "wrote logits [%lld, %lld] to %s\n", (long long)n, (long long)V, o.out.c_str());
  return 0;
}

cm::cli::CommandRegistrar reg({"logits", "Compute logits for a token sequence and write them as safetensors",
                               [](CLI::App& app) -> cm::cli::CommandRun {
                                 auto o = std::make_shared<Opts>();
                                 cm::cli::add_engine_options(app, o->eng);
                                 app.add_option("--tokens", o->tokens,
                                                "Token ids, comma- or space-separated; '-' reads them from stdin");
                                 app.add_option("--tokens-file", o->tokens_file,
                                                "A file of token ids (commas, spaces or newlines between them; '-' = "
                                                "stdin): for sequences too long for the command line");
                                 app.add_option("--chunk", o->chunk, "Feed N tokens per model step (default all)");
                                 app.add_option("-o,--out", o->out, "Output .safetensors file")->required();
                                 return [o] { return run(*o); };
                               }});

}  // namespace
