// `clawmine serve [-m DIR] [--host 127.0.0.1] [--port 8080] [--api-key KEY]
//   [--served-model-name NAME] [--max-seqs N] [--max-step-tokens N] [--ctx N] [--device auto|cpu|cuda]`
// An OpenAI-compatible server (vLLM / llama-server conventions) over the serving engine: one
// engine thread batches every running request per step; HTTP threads parse and stream.
// SIGTERM (or Ctrl-C) drains: new requests get 503, running ones finish, then the process exits;
// a second signal exits at once.
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>
#include <thread>

#include "cli/commands.h"
#include "cli/engine_options.h"
#include "cli/serve_ranks.h"
#include "cli/version.h"
#include "common/error.h"
#include "common/log.h"
#include "grammar/grammar.h"
#include "sampling/generation_config.h"
#include "seam/backend.h"
#include "seam/observer.h"
#include "runtime/engine.h"
#include "runtime/stop_rule.h"
#include "serve/http_policy.h"
#include "serve/http_server.h"
#include "tokenizer/tokenizer.h"
#include "runtime/layer_stats.h"
#include "factory/factory.h"
#include "factory/leader_backend.h"

namespace {

struct Opts {
  cm::cli::EngineOptions eng;
  cm::serve::HttpOptions http;
  cm::LogOptions log;
  // 0 = chosen (runtime/sizing.h): on the GPU from the memory left after the weights; on the CPU 8 slots,
  // 256-token steps, the model's context up to 4096.
  int32_t max_seqs = 0, max_step_tokens = 0;
  int64_t ctx = 0;
  bool prefix_caching = true;
  int gpus = 0;  // --gpus N: expert parallelism over N GPUs (0: one GPU, no NCCL)
  cm::cli::LaunchOptions launch;  // --rank, --world-size, ... (torchrun's variables)
};

// Request defaults from generation_config.json: only the sampling fields the file states
// (do_sample false there means greedy, as in transformers); absent ones fall back on OpenAI's.
cm::serve::RequestDefaults request_defaults(const std::string& dir) {
  cm::serve::RequestDefaults d;
  const cm::GenerationDefaults gd = cm::load_generation_config(dir);  // validates the file
  std::ifstream f(std::filesystem::path(dir) / "generation_config.json");
  if (!f) return d;
  nlohmann::json j = nlohmann::json::parse(f, nullptr, false);
  if (!j.is_object()) return d;
  const bool sampled = j.value("do_sample", false);
  if (j.contains("do_sample") && !sampled) d.temperature = 0.0f;
  if (sampled && j.contains("temperature")) d.temperature = gd.sampling.temperature;
  if (j.contains("top_p")) d.top_p = gd.sampling.top_p;
  if (j.contains("top_k")) d.top_k = gd.sampling.top_k;
  if (j.contains("min_p")) d.min_p = gd.sampling.min_p;
  if (j.contains("repetition_penalty")) d.repetition_penalty = gd.sampling.repetition_penalty;
  return d;
}

int run(Opts& o) {
  // Signals are taken by one waiting thread: block them before any other thread exists.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGINT);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  signal(SIGPIPE, SIG_IGN);  // a client that left must not kill the server

  cm::setup_logging(o.log);
  if (o.max_seqs < 0) cm::fail("--max-seqs must be >= 1, or 0 to size it to the device (got {})", o.max_seqs);
  if (o.max_step_tokens < 0)
    cm::fail("--max-step-tokens must be >= 1, or 0 to size it to the device (got {})", o.max_step_tokens);
  if (o.max_step_tokens > 0 && o.max_seqs > 0 && o.max_step_tokens < o.max_seqs)
    cm::fail("--max-step-tokens ({}) must be at least --max-seqs ({})", o.max_step_tokens, o.max_seqs);
  if (o.http.http_threads < 4) cm::fail("--threads-http must be >= 4 (got {})", o.http.http_threads);
  cm::serve::parse_allowed_origins(o.http.allowed_origins);  // a bad list fails before the model loads
  const cm::cli::VersionInfo v = cm::cli::version_info();
  o.http.version = v.version;
  o.http.commit = v.commit;

  // Several GPUs: this process's rank (the others follow rank 0's calls and never serve HTTP).
  std::unique_ptr<cm::cli::ServeRanks> ranks = cm::cli::start_ranks(o.eng, o.gpus, o.launch);
  if (ranks && ranks->env.rank != 0) return cm::cli::follow(*ranks, o.eng);

  auto model = cm::cli::load_model(o.eng);
  const cm::Config& c = model->config;
  if (o.ctx != 0 && (o.ctx < 2 || o.ctx > c.max_position_embeddings))
    cm::fail("--ctx must be in [2, {}] (the model's max_position_embeddings), got {}", c.max_position_embeddings, o.ctx);
  cm::Tokenizer tok = cm::Tokenizer::load(o.eng.model);
  cm::LayerStatsObserver stats(stderr);
  // The shared flags pick the device (--device auto|cpu|cuda); what is left at 0 is sized to it.
  cm::runtime::Sizing sized;
  const cm::runtime::SizingRequest req{o.max_seqs, o.max_step_tokens, o.ctx, c.max_position_embeddings};
  std::unique_ptr<cm::ModelBackend> local;
  std::unique_ptr<cm::LeaderBackend> lead;  // over ranks: forwards reserve and every step to the others
  if (ranks) {
    local = cm::cli::unreserved_backend(o.eng, *model, &stats);
    sized = cm::runtime::size_reservation(*local, req);
    lead = std::make_unique<cm::LeaderBackend>(*local, *ranks->comm);
    lead->reserve(sized.shape);
  } else {
    local = cm::cli::make_backend(o.eng, *model, &stats, req, &sized);
  }
  cm::ModelBackend* backend = lead ? static_cast<cm::ModelBackend*>(lead.get()) : local.get();
  const cm::CacheShape shape = sized.shape;
  o.max_seqs = shape.max_slots, o.max_step_tokens = shape.max_step_tokens, o.ctx = shape.max_ctx;
  if (!sized.why.empty()) spdlog::info("clawmine serve: {}", sized.why);
  spdlog::info("clawmine serve: {:.1f} MiB of sequence state per slot, {} slots",
               double(backend->bytes_per_slot(shape)) / (1 << 20), o.max_seqs);

  if (o.http.model_name.empty()) {
    std::filesystem::path p(o.eng.model);
    o.http.model_name = (p.has_filename() ? p.filename() : p.parent_path().filename()).string();
  }
  o.http.ctx = o.ctx;
  o.http.vocab = c.vocab_size;
  cm::runtime::EngineOptions eo;
  eo.max_seqs = o.max_seqs;
  eo.max_step_tokens = o.max_step_tokens;
  eo.ctx = o.ctx;
  eo.sample_on_device = o.eng.sample_on_device;
  eo.mtp_draft = o.eng.mtp;
  eo.prefix_caching = o.prefix_caching;
  if (lead) eo.on_idle = [&lead] { lead->keepalive(); };  // the followers' wait for a call would time out
  eo.eos_ids = cm::runtime::end_of_sequence_ids(c, &tok, cm::load_generation_config(o.eng.model));

  // One grammar compiler per server (structured output): the tokenizer's bytes padded to the logits
  // width, and the EOS set as the ids that may end a complete match.
  o.http.grammar = std::make_shared<cm::GrammarCompiler>(tok, c.vocab_size, eo.eos_ids);
  cm::serve::Metrics metrics(o.http.model_name);
  cm::runtime::Engine engine(*backend, &tok, c.vocab_size, eo, &metrics);
  cm::serve::HttpServer http(engine, tok, metrics, request_defaults(o.eng.model), o.http);
  const int port = http.bind();
  engine.start();

  std::atomic<bool> done{false};
  std::thread waiter([&] {
    const timespec tick{0, 100 * 1000 * 1000};
    while (!done) {
      if (sigtimedwait(&sigs, nullptr, &tick) < 0) continue;
      spdlog::info("clawmine serve: draining (a second signal stops at once)");
      http.refuse_new();
      while (http.busy() && sigtimedwait(&sigs, nullptr, &tick) < 0) {
      }
      engine.stop();  // after a second signal: ends what still runs, so no handler waits forever
      http.stop();
      return;
    }
  });
  spdlog::info("clawmine serve: model '{}' on http://{}:{} (device {}, max-seqs {}, max-step-tokens {}, ctx {})",
               o.http.model_name, o.http.host, port, cm::device_name(backend->device()), o.max_seqs, o.max_step_tokens,
               o.ctx);
  http.serve();
  done = true;
  waiter.join();
  engine.stop();
  spdlog::info("clawmine serve: stopped");
  return 0;
}

cm::cli::CommandRegistrar reg(
    {"serve", "OpenAI-compatible HTTP server with continuous batching", [](CLI::App& app) -> cm::cli::CommandRun {
       auto o = std::make_shared<Opts>();
       cm::cli::add_engine_options(app, o->eng);
       cm::cli::add_mtp_option(app, o->eng);
       app.add_option("--host", o->http.host, "Address to listen on")->capture_default_str();
       app.add_option("--port", o->http.port, "Port (0 = any free port)")->capture_default_str()->check(CLI::Range(0, 65535));
       app.add_option("--api-key", o->http.api_key, "Require Authorization: Bearer KEY on /v1 and /(de)tokenize")
           ->envname("CLAWMINE_API_KEY");
       app.add_option("--served-model-name", o->http.model_name, "Model name in the API (default: the model folder's name)");
       app.add_option("--gpus", o->gpus,
                      "Expert parallelism over N GPUs, one process each: this one is rank 0 and starts the others "
                      "(under torchrun/mpirun/srun their RANK and WORLD_SIZE are used instead)");
       cm::cli::add_launch_options(app, o->launch);
       app.add_option("--max-seqs", o->max_seqs,
                      "Sequences decoded together (slots; default: on the GPU as many as fit the memory left after "
                      "the weights, at most 256; on the CPU 8)");
       app.add_option("--max-step-tokens", o->max_step_tokens,
                      "Tokens per engine step (decode + prefill chunks; default 2048 on the GPU, 256 on the CPU)");
       app.add_flag("--enable-prefix-caching,!--no-enable-prefix-caching", o->prefix_caching,
                    "Start prompts from a slot that holds their longest prefix, and keep prefixes that requests "
                    "share (a system prompt) as snapshots in free slots (default on; the same logits either way)")
           ->envname("CLAWMINE_PREFIX_CACHING");
       app.add_option("-c,--ctx-size,--ctx", o->ctx,
                      "Context per sequence (default: the model's max_position_embeddings, at most 32768 on the GPU "
                      "(halved while one slot does not fit) and 4096 on the CPU)");
       app.add_option("--threads-http", o->http.http_threads, "HTTP worker threads (each open stream holds one)")
           ->capture_default_str();
       app.add_option("--max-body-bytes", o->http.max_body_bytes, "Largest request body accepted (413 beyond)")
           ->capture_default_str();
       app.add_option("--allowed-origins", o->http.allowed_origins,
                      "CORS: origins browsers may call from, a comma list (http://localhost:3000,...) or * for any "
                      "(default: none, no CORS headers)")
           ->envname("CLAWMINE_ALLOWED_ORIGINS");
       app.add_option("--log-level", o->log.level, "Least severe log lines shown: debug, info, warn, error or off")
           ->capture_default_str()
           ->check(CLI::IsMember({"debug", "info", "warn", "error", "off"}));
       app.add_option("--log-file", o->log.file, "Also append the log to this file (timestamped lines, as on stderr)");
       app.add_flag("--strict-requests", o->http.strict_requests,
                    "Refuse a request naming a field the server does not read (400 naming it); by default such "
                    "fields are named in the log and ignored, as vLLM does");
       return [o] { return run(*o); };
     }});

}  // namespace
