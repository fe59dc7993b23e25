#include "cli/engine_options.h"

#include <omp.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <random>

#include "cli/threads.h"
#include "common/error.h"
#include "sampling/generation_config.h"
#include "factory/factory.h"
#include "model/dummy.h"
#ifdef CLAWMINE_HAVE_CUDA
#include "bench/bench_model.h"
#endif

namespace cm::cli {

namespace fs = std::filesystem;

std::string default_model_dir() {
  // Relative to the binary, never a path fixed at configure time, so the build
  // tree and an installed (or moved) prefix both work.
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (ec) fail("cannot locate the clawmine binary (/proc/self/exe: {}) to find the default model; give -m DIR",
               ec.message());
  const fs::path bin = exe.parent_path();
  const fs::path tries[] = {bin / ".." / "share" / "clawmine" / "models" / "default",
                            bin / "share" / "clawmine" / "models" / "default"};
  for (const fs::path& p : tries)
    if (fs::exists(p / "config.json")) return fs::weakly_canonical(p).string();
  fail("the default model is not installed next to {} (looked in {} and {}); give -m DIR", exe.string(),
       tries[0].lexically_normal().string(), tries[1].lexically_normal().string());
}

CLI::Option* add_model_option(CLI::App& app, std::string& model, CLI::Option** flag) {
  CLI::Option* m = app.add_option("-m,--model", model,
                                  "Checkpoint directory (config.json + *.safetensors); default: the embedded "
                                  "default model installed with clawmine")
                       ->envname("CLAWMINE_MODEL");
  if (flag) *flag = m;
  return m;
}

std::string resolve_model(const std::string& model, const CLI::Option* flag) {
  if (!model.empty()) return model;
  if (flag && flag->count() > 0)
    fail("-m/--model: empty directory name (leave -m out to use the embedded default model)");
  return default_model_dir();
}

void add_engine_options(CLI::App& app, EngineOptions& o) {
  add_model_option(app, o.model, &o.model_flag);
  app.add_option("-t,--threads", o.threads,
                 "CPU threads (0 = the default: the cores not busy with other processes when clawmine starts)")->envname("CLAWMINE_THREADS")
      ->check(CLI::Range(0, 4096));
  app.add_flag("--layer-stats", o.layer_stats,
               "After every layer print amax/mean/NaN/Inf of each residual stream and of the attention and MoE "
               "outputs (stderr)");
  app.add_flag("--derive-input-scale", o.derive_input_scale,
               "NVFP4: derive a missing per-expert input_scale (max over the layer's experts) instead of failing");
  app.add_option("--act-quant", o.act_quant,
                 "Activation handling for NVFP4 weights: none (weight-only, fp32 activations) or nvfp4 (emulate a "
                 "W4A4 Blackwell kernel)")
      ->check(CLI::IsMember({"none", "nvfp4"}));
  app.add_option("--device", o.device, "Where the model runs: auto (cuda when a GPU is present), cpu or cuda")
      ->envname("CLAWMINE_DEVICE")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  app.add_option("--load-format", o.load_format,
                 "auto: read the checkpoint's safetensors; dummy: random weights of config.json's shape in the "
                 "release formats, nothing else read (generated on the GPU with --device cuda; vLLM's name)")
      ->envname("CLAWMINE_LOAD_FORMAT")
      ->check(CLI::IsMember({"auto", "dummy"}));
  app.add_option("--num-layers", o.num_layers,
                 "With --load-format dummy: keep the config's first N layers (0 = all), so a V4-Flash or V4-Pro "
                 "config fits one GPU")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 20));
  app.add_flag("--enforce-eager", o.enforce_eager,
               "CUDA: launch every kernel of a step eagerly instead of replaying the step's CUDA graph (same results, "
               "slower; for debugging and profiling)")
      ->envname("CLAWMINE_ENFORCE_EAGER");
  app.add_flag("--concurrent-branches,!--no-concurrent-branches", o.concurrent_branches,
               "CUDA: run a layer's independent branches (compressor and indexer projections, the shared expert) on "
               "a second stream beside the main path in steps of up to 256 tokens (default on; same results; "
               "--no-concurrent-branches runs every kernel on one stream)")
      ->envname("CLAWMINE_CONCURRENT_BRANCHES");
  app.add_option("--kv-cache-dtype", o.kv_cache_dtype,
                 "Attention cache precision: auto (the backend's own: CPU f32, CUDA bf16) or fp8 (fp8_e4m3: rows and "
                 "compressed entries in E4M3 with a power-of-two scale per 64 channels and the rope channels in bf16, "
                 "indexer keys in E4M3 with one scale each; vLLM's name). The CPU backend rounds to these values and "
                 "keeps them in f32 (no memory saved: the oracle for a GPU FP8 cache); the CUDA backend refuses it for "
                 "now")
      ->envname("CLAWMINE_KV_CACHE_DTYPE")
      ->check(CLI::IsMember({"auto", "fp8", "fp8_e4m3"}));
  app.add_flag("--fast-prefill", o.fast_prefill,
               "CUDA: run the quantized linears of prefill steps over 256 tokens as BF16 cuBLAS GEMMs (faster; a "
               "prompt's logits then depend on its chunking and on what shares its step, within bf16 rounding)")
      ->envname("CLAWMINE_FAST_PREFILL");
  app.add_flag("--sample-on-device,!--no-sample-on-device", o.sample_on_device,
               "Draw tokens where the logits are (the GPU, or the CPU backend's own memory) in the steps that allow "
               "it (no logprobs, no grammar): the same tokens, without copying vocab-wide logits rows to the host "
               "(default on; --no-sample-on-device or CLAWMINE_SAMPLE_ON_DEVICE=0 samples every row on the host)")
      ->envname("CLAWMINE_SAMPLE_ON_DEVICE");
  app.add_option("--gpu-memory-utilization", o.gpu_memory_utilization,
                 "CUDA: the fraction of the GPU's total memory clawmine may use for weights, per-sequence state, "
                 "activations and workspaces, in (0, 1] (default 0.9); a model that does not fit in "
                 "min(free, fraction x total) is refused")
      ->envname("CLAWMINE_GPU_MEMORY_UTILIZATION")
      ->check(CLI::Validator(
          [](const std::string& v) -> std::string {
            // The value is parsed by the option itself; here only the range (NaN fails it too).
            double u = 0;
            try {
              size_t used = 0;
              u = std::stod(v, &used);
              if (used != v.size()) return "must be a number in (0, 1] (got '" + v + "')";
            } catch (const std::exception&) {
              return "must be a number in (0, 1] (got '" + v + "')";
            }
            return u > 0 && u <= 1 ? std::string() : "must be in (0, 1] (got " + v + ")";
          },
          "FRACTION in (0, 1]", "fraction"));
}

void add_mtp_option(CLI::App& app, EngineOptions& o) {
  app.add_option("--mtp", o.mtp,
                 "Speculative decoding with the checkpoint's MTP block: draft K tokens per sequence and step and keep "
                 "those the model itself would draw (the same text as without; 0 = off, the default; K in [0, " +
                     std::to_string(kMaxDraft) + "]; CPU backend)")
      ->envname("CLAWMINE_MTP")
      ->check(CLI::Range(0, int(kMaxDraft)));
}

void add_sampling_options(CLI::App& app, SamplingParams& sp, int64_t& seed) {
  app.add_option("--temp", sp.temperature, "Temperature (0 = greedy; default from generation_config.json, else greedy)");
  app.add_option("--top-k", sp.top_k, "Top-k (0 = off)");
  app.add_option("--top-p", sp.top_p, "Top-p (1 = off)");
  app.add_option("--min-p", sp.min_p, "Min-p (0 = off)");
  app.add_option("--repeat-penalty", sp.repetition_penalty, "Repetition penalty (1 = off)");
  app.add_option("--presence-penalty", sp.presence_penalty, "Presence penalty");
  app.add_option("--frequency-penalty", sp.frequency_penalty, "Frequency penalty");
  app.add_option("-s,--seed", seed, "Random seed (-1 = random, the default; the seed used is printed)");
}

void check_seed(int64_t seed) {
  if (seed < -1) fail("-s/--seed must be -1 (random) or >= 0 (got {})", seed);
}

SamplingParams effective_sampling(const CLI::App& app, const SamplingParams& f, int64_t seed,
                                  const std::string& model_dir) {
  check_seed(seed);
  SamplingParams sp = load_generation_config(model_dir).sampling;
  auto given = [&](const char* flag) { return app.count(flag) > 0; };
  if (given("--temp")) sp.temperature = f.temperature;
  if (given("--top-k")) sp.top_k = f.top_k;
  if (given("--top-p")) sp.top_p = f.top_p;
  if (given("--min-p")) sp.min_p = f.min_p;
  if (given("--repeat-penalty")) sp.repetition_penalty = f.repetition_penalty;
  if (given("--presence-penalty")) sp.presence_penalty = f.presence_penalty;
  if (given("--frequency-penalty")) sp.frequency_penalty = f.frequency_penalty;
  // A random seed is printed with the stats, so it fits in 32 bits to be easy to retype.
  sp.seed = seed >= 0 ? uint64_t(seed) : uint64_t(std::random_device{}() & 0x7fffffffu);
  validate_sampling_params(sp);
  return sp;
}

std::unique_ptr<Model> load_model(EngineOptions& o) {
  o.model = resolve_model(o.model, o.model_flag);
  o.threads_used = o.threads > 0 ? o.threads : default_threads();
  // More OpenMP threads than cores only time-slice them: every parallel region then waits for
  // a descheduled thread (runs get several times slower, not faster).
  if (const int cores = available_cores(); o.threads > cores)
    std::fprintf(stderr, "warning: -t %d exceeds the %d cores this process may use; expect slower runs (-t 0 picks "
                 "the free cores)\n", o.threads, cores);
  omp_set_num_threads(o.threads_used);
  LoadOptions lo;
  lo.linear.allow_missing_input_scale = o.derive_input_scale;
  lo.experts = o.experts;
  lo.mtp = o.mtp > 0;  // the MTP block's weights are read only when something drafts with them
  const bool tty = ::isatty(STDERR_FILENO);
  if (tty) {
    std::fprintf(stderr, "loading %s: mapping and validating every tensor...", o.model.c_str());
    std::fflush(stderr);
    // A 160 GB checkpoint takes a while: show the linears validated so far,
    // at most ~10 times a second.
    lo.linear.on_validated = [dir = o.model, last = std::chrono::steady_clock::time_point{}](size_t done,
                                                                                             size_t total) mutable {
      auto now = std::chrono::steady_clock::now();
      if (done != total && now - last < std::chrono::milliseconds(100)) return;
      last = now;
      std::fprintf(stderr, "\rloading %s: %zu/%zu linears validated", dir.c_str(), done, total);
      std::fflush(stderr);
    };
  }
  auto t0 = std::chrono::steady_clock::now();
  std::unique_ptr<Model> m;
  if (o.load_format == "dummy") {
    // Random weights of the config's shape: generated on the GPU by the CUDA backend (make_backend), on
    // the host here for the CPU's.
    const Config whole = config_load(o.model), c = keep_first_layers(whole, o.num_layers);
    m = dummy_model(c, resolved_device(o) == Device::CPU);
    o.load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, "%s: dummy weights (--load-format dummy), %lld of %lld layers\n", o.model.c_str(),
                 (long long)c.num_layers, (long long)whole.num_layers);
    return m;
  }
  if (o.num_layers != 0) fail("--num-layers keeps layers of dummy weights only (give --load-format dummy)");
  try {
    m = model_load(o.model, lo);
  } catch (...) {
    if (tty) std::fputc('\n', stderr);
    throw;
  }
  o.load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (tty)
    std::fprintf(stderr, "\rloaded %s: %zu tensors, %.1f MB mapped and validated in %.2f s%20s\n", o.model.c_str(),
                 m->store.all().size(), double(m->store.total_bytes()) / 1e6, o.load_seconds, "");
  return m;
}

int64_t context_size(const EngineOptions& o, const Model& m) {
  const int64_t model_ctx = m.config.max_position_embeddings;
  if (o.ctx_size < 0) fail("--ctx-size must be >= 0 (got {})", o.ctx_size);
  if (o.ctx_size > model_ctx) fail("--ctx-size {} exceeds the model's context of {}", o.ctx_size, model_ctx);
  return o.ctx_size > 0 ? o.ctx_size : std::min<int64_t>(model_ctx, 4096);
}

Device resolved_device(const EngineOptions& o) {
  return o.device == "cpu" ? Device::CPU : o.device == "cuda" ? Device::CUDA : (gpu_present() ? Device::CUDA : Device::CPU);
}

std::unique_ptr<ModelBackend> unreserved_backend(const EngineOptions& o, const Model& m, Observer* stats) {
  BackendOptions bo;
  bo.observer = o.layer_stats ? stats : nullptr;
  bo.act_quant = o.act_quant == "nvfp4" ? ActQuant::NVFP4 : ActQuant::NONE;
  bo.gpu_memory_utilization = o.gpu_memory_utilization;
  bo.cuda_graphs = !o.enforce_eager;
  bo.concurrent_branches = o.concurrent_branches;
  bo.batch_invariant = !o.fast_prefill;
  bo.kv_cache = o.kv_cache_dtype == "auto" ? KvCache::AUTO : KvCache::FP8;
  bo.ep_comm = o.ep_comm;
  bo.cuda_device = o.cuda_device;
  const Device d = resolved_device(o);
  // The CUDA backend refuses it too; saying so here spares loading (or generating) the weights first.
  if (bo.kv_cache != KvCache::AUTO && d == Device::CUDA)
    fail("--kv-cache-dtype {}: not built for the CUDA backend yet (the CPU backend has it: --device cpu)",
         o.kv_cache_dtype);
  std::fprintf(stderr, "clawmine: running on %s%s\n", device_name(d), o.device == "auto" ? " (--device auto)" : "");
  if (o.load_format == "dummy" && d == Device::CUDA) {
#ifdef CLAWMINE_HAVE_CUDA
    return cuda::make_dummy_cuda_backend(m, bo, o.mtp > 0);
#else
    fail("--load-format dummy --device cuda: this clawmine was built without the CUDA backend");
#endif
  }
  return cm::make_backend(m, d, bo);
}

std::unique_ptr<ModelBackend> make_backend(const EngineOptions& o, const Model& m, Observer* stats, CacheShape shape) {
  std::unique_ptr<ModelBackend> be = unreserved_backend(o, m, stats);
  if (shape.max_ctx == 0) shape.max_ctx = context_size(o, m);
  be->reserve(shape);
  return be;
}

std::unique_ptr<ModelBackend> make_backend(const EngineOptions& o, const Model& m, Observer* stats,
                                           const runtime::SizingRequest& sizing, runtime::Sizing* sized) {
  std::unique_ptr<ModelBackend> be = unreserved_backend(o, m, stats);
  *sized = runtime::size_reservation(*be, sizing);
  be->reserve(sized->shape);
  return be;
}

}  // namespace cm::cli
