// `clawmine logits --model DIR --tokens 5,17,42 [--chunk N] --out FILE`
// Feeds the tokens N at a time (default: all at once) and writes a
// safetensors file with one F32 tensor `logits` [tokens, vocab].
#include <cstdio>
#include <memory>

#include "cli/cli_util.h"
#include "cli/commands.h"
#include "common/error.h"
#include "io/safetensors.h"
#include "model/model.h"

namespace {

struct Opts {
  std::string model, tokens, out;
  int64_t chunk = 0;
  bool layer_stats = false;
  bool derive_input_scale = false;
};

int run(const Opts& o) {
  std::vector<int32_t> toks = cm::cli::parse_token_list(o.tokens);
  if (o.chunk < 0) cm::fail("--chunk must be >= 1 (got {})", o.chunk);
  cm::LoadOptions lo;
  lo.linear.allow_missing_input_scale = o.derive_input_scale;
  auto m = cm::model_load(o.model, lo);
  cm::State st = cm::state_new(m->config);
  cm::LayerStatsObserver stats(stderr);
  cm::ForwardOptions fo;
  fo.all_logits = true;
  fo.observer = o.layer_stats ? &stats : nullptr;
  const int64_t n = int64_t(toks.size()), V = m->config.vocab_size;
  const int64_t chunk = o.chunk > 0 ? o.chunk : n;
  std::vector<float> logits;
  logits.reserve(size_t(n * V));
  for (int64_t i = 0; i < n; i += chunk) {
    int64_t len = std::min(chunk, n - i);
    std::vector<float> l = cm::forward(*m, st, toks.data() + i, len, fo);
    logits.insert(logits.end(), l.begin(), l.end());
  }
  cm::write_safetensors(o.out, {cm::tensor_f32("logits", {n, V}, logits.data())});
  std::fprintf(stderr, "wrote logits [%lld, %lld] to %s\n", (long long)n, (long long)V, o.out.c_str());
  return 0;
}

cm::cli::CommandRegistrar reg({"logits", "Compute logits for a token sequence and write them as safetensors",
                               [](CLI::App& app) -> cm::cli::CommandRun {
                                 auto o = std::make_shared<Opts>();
                                 app.add_option("-m,--model", o->model, "Checkpoint directory")->required();
                                 app.add_option("--tokens", o->tokens, "Comma-separated token ids")->required();
                                 app.add_option("--chunk", o->chunk, "Feed N tokens per forward call (default all)");
                                 app.add_option("-o,--out", o->out, "Output .safetensors file")->required();
                                 app.add_flag("--layer-stats", o->layer_stats,
                                              "Print amax/mean/NaN/Inf of residual streams, attention and MoE "
                                              "outputs after every layer (stderr)");
                                 app.add_flag("--derive-input-scale", o->derive_input_scale,
                                              "NVFP4: derive a missing per-expert input_scale instead of failing");
                                 return [o] { return run(*o); };
                               }});

}  // namespace
