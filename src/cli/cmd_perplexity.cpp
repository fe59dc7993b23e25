// `clawmine perplexity -m DIR (--file F | --tokens LIST|- | --tokens-file F) [--ctx N] [--stride S] [--chunks K]`
// (llama.cpp's llama-perplexity is the model). The file's exact bytes are
// tokenized with the model's tokenizer and cut into windows of N tokens that
// start every S tokens (S = N by default: non-overlapping). Each window runs
// from a fresh state; the first window scores every token after its first,
// later windows score only their last S tokens (those no earlier window
// scored). Only full windows are used. Prints a progress line on stderr and
// the perplexity exp(mean NLL) on stdout, then llama-perplexity's
// "Final estimate: PPL = x +/- e" line, e = PPL * (standard error of the
// mean NLL over the scored tokens).
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>

#include "cli/cli_util.h"
#include "cli/commands.h"
#include "cli/engine_options.h"
#include "common/error.h"
#include "io/input_file.h"
#include "tokenizer/tokenizer.h"
#include "runtime/layer_stats.h"
#include "factory/factory.h"

namespace {

struct Opts {
  cm::cli::EngineOptions eng;
  std::string file, tokens, tokens_file;
  int64_t ctx = 0, stride = 0, chunks = 0;
  bool ctx_given = false, stride_given = false, chunks_given = false;
};

int run(Opts& o) {
  // Flags given explicitly must be positive (0 / -1 are not "the default").
  if (o.ctx_given && o.ctx < 2) cm::fail("--ctx must be >= 2 (got {})", o.ctx);
  if (o.stride_given && o.stride < 1) cm::fail("--stride must be >= 1 (got {})", o.stride);
  if (o.chunks_given && o.chunks < 1) cm::fail("--chunks must be >= 1 (got {})", o.chunks);
  // the text's tokens, or token ids as given (no tokenizer needed)
  const bool from_ids = !o.tokens.empty() || !o.tokens_file.empty();
  if (from_ids == !o.file.empty())
    cm::fail("give the text to score one way: --file TEXT, or token ids with --tokens LIST|- or --tokens-file PATH");
  std::vector<int32_t> ids;
  std::string text;
  if (from_ids)
    ids = cm::cli::read_token_ids(o.tokens, o.tokens_file);
  else
    text = cm::read_regular_file(o.file, cm::kMaxTextBytes, "--file");
  auto m = cm::cli::load_model(o.eng);
  if (!from_ids) ids = cm::Tokenizer::load(o.eng.model).encode(text, cm::EncodeOptions{false, false});
  const int64_t N = int64_t(ids.size()), V = m->config.vocab_size;
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] >= V) cm::fail("token {} (at {}) is outside the model's vocabulary of {}", ids[i], i, V);
  const int64_t ctx = o.ctx > 0 ? o.ctx : std::min<int64_t>(1024, m->config.max_position_embeddings);
  const int64_t stride = o.stride > 0 ? o.stride : ctx;
  if (ctx < 2) cm::fail("--ctx must be >= 2 (got {})", ctx);
  if (ctx > m->config.max_position_embeddings)
    cm::fail("--ctx {} exceeds the model's context of {}", ctx, m->config.max_position_embeddings);
  if (stride > ctx) cm::fail("--stride {} must not exceed --ctx {}", stride, ctx);
  if (N < ctx)
    cm::fail("{}: {} tokens, fewer than one window of --ctx {}", from_ids ? std::string("the token ids") : o.file, N, ctx);
  int64_t windows = (N - ctx) / stride + 1;
  if (o.chunks_given) windows = std::min(windows, o.chunks);
  cm::LayerStatsObserver stats(stderr);
  auto be = cm::cli::make_backend(o.eng, *m, &stats, cm::CacheShape{1, int32_t(ctx), ctx});
  std::vector<float> logits(size_t(ctx * V));
  std::vector<int32_t> pos(static_cast<size_t>(ctx)), slot(size_t(ctx), 0);
  std::vector<uint8_t> want(size_t(ctx), 1);
  for (int64_t i = 0; i < ctx; ++i) pos[size_t(i)] = int32_t(i);
  double nll = 0, nll2 = 0;
  int64_t scored = 0;
  auto t0 = std::chrono::steady_clock::now();
  for (int64_t w = 0; w < windows; ++w) {
    const int64_t start = w * stride;
    be->reset_slot(0);
    be->step(cm::Batch{int32_t(ctx), ids.data() + start, pos.data(), slot.data(), want.data()}, logits.data());
    const int64_t first = w == 0 ? 1 : ctx - stride;  // positions whose token is predicted
    for (int64_t p = std::max<int64_t>(first, 1); p < ctx; ++p) {
      const float* row = &logits[size_t((p - 1) * V)];
      float mx = row[0];
      for (int64_t v = 1; v < V; ++v) mx = std::max(mx, row[v]);
      double sum = 0;
      for (int64_t v = 0; v < V; ++v) sum += std::exp(double(row[v] - mx));
      const double l = std::log(sum) + mx - row[ids[size_t(start + p)]];
      nll += l;
      nll2 += l * l;
      ++scored;
    }
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, "\r[%lld/%lld] ppl %.4f  %.0f tok/s ", (long long)(w + 1), (long long)windows,
                 std::exp(nll / double(scored)), double((w + 1) * ctx) / secs);
    std::fflush(stderr);
  }
  std::fprintf(stderr, "\n");
  std::printf("perplexity: %.4f (%lld tokens scored, %lld windows, ctx %lld, stride %lld)\n",
              std::exp(nll / double(scored)), (long long)scored, (long long)windows, (long long)ctx,
              (long long)stride);
  const double mean = nll / double(scored), ppl = std::exp(mean);
  const double var = scored > 1 ? std::max(0.0, nll2 / double(scored) - mean * mean) : 0.0;
  const double se = scored > 1 ? std::sqrt(var / double(scored - 1)) : 0.0;
  std::printf("Final estimate: PPL = %.4f +/- %.5f\n", ppl, se * ppl);
  return 0;
}

cm::cli::CommandRegistrar reg({"perplexity", "Perplexity of a model on a text file (llama-perplexity style)",
                               [](CLI::App& app) -> cm::cli::CommandRun {
                                 auto o = std::make_shared<Opts>();
                                 cm::cli::add_engine_options(app, o->eng);
                                 app.add_option("-f,--file", o->file, "Text file (its exact bytes)");
                                 app.add_option("--tokens", o->tokens,
                                                "Token ids instead of a text, comma- or space-separated; '-' reads "
                                                "them from stdin");
                                 app.add_option("--tokens-file", o->tokens_file,
                                                "A file of token ids instead of a text ('-' = stdin)");
                                 auto* c = app.add_option("-c,--ctx", o->ctx, "Window length in tokens (default 1024)");
                                 auto* s = app.add_option("--stride", o->stride, "Window start spacing (default --ctx)");
                                 auto* k = app.add_option("--chunks", o->chunks, "Evaluate at most this many windows");
                                 return [o, c, s, k] {
                                   o->ctx_given = c->count() > 0;
                                   o->stride_given = s->count() > 0;
                                   o->chunks_given = k->count() > 0;
                                   return run(*o);
                                 };
                               }});

}  // namespace
