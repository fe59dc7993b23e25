// `clawmine bench kernels [--only PATTERN] [--list] [--check] [--json]`: times
// the cases of the GPU op table (bench/optable, the table the GPU tests check)
// against a same-run device copy and cuBLAS BF16 (see bench/bench_kernels.h). `clawmine bench model`: the whole CUDA step
// on a synthetic V4-Flash-shaped model (backend/cuda/bench_model.h). Without
// the CUDA backend, or without a GPU, it says so and exits 1.
#include <fmt/format.h>

#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "common/error.h"
#ifdef CLAWMINE_HAVE_CUDA
#include "bench/bench_kernels.h"
#include "bench/bench_model.h"
#endif
#include "seam/backend.h"
#include "factory/factory.h"

namespace {

struct BenchOptions {
  std::string what;
  bool json = false;
  std::string json_file;
  std::string only;
  bool list = false, check = false;
  uint64_t seed = 1;
  int repeats = 7;
  bool no_pdl = false;
  bool fast_prefill = false;
  bool sample_on_device = true;
  bool concurrent_branches = true;
  // bench model
  int64_t layers = 0;
  std::vector<int64_t> prefill{2048, 8192};
  std::vector<int64_t> batches{1, 8, 64, 256};
  std::vector<int64_t> mtp;  // model: MTP verify steps of 1 + K tokens per slot
  std::vector<int64_t> contexts{4096, 32768};
  int warmup = 2;
  int64_t prefill_chunk = 8192, fill_chunk = 4096;
  double max_seconds = 0;
};

#ifdef CLAWMINE_HAVE_CUDA
void print_table(const cm::cuda::KernelBenchResult& r) {
  fmt::print("GPU: {}   device-to-device copy: {:.0f} GB/s (read + write)   empty kernel in a graph: {:.2f} us\n",
             r.gpu, r.copy_gbs, r.empty_us);
  fmt::print("{:<52} {:>8} {:>9} {:>7} {:>8} {:>10} {:>9} {:>7} {:>8}  {}\n", "case", "us", "GB/s", "%copy", "TFLOP/s",
             "cuBLAS us", "cuBLAS TF", "speedup", "copy us", "path");
  for (const auto& row : r.rows) {
    std::string cub = row.cublas_us > 0 ? fmt::format("{:10.2f} {:9.1f} {:6.2f}x", row.cublas_us, row.cublas_tflops,
                                                      row.speedup)
                                        : fmt::format("{:>10} {:>9} {:>7}", "-", "-", "-");
    std::string path = row.path;
    if (!row.check.empty()) path += fmt::format("  [check: {}]", row.check);
    if (row.us <= 0) {
      fmt::print("{:<52} {:>8}  {}\n", row.name, "-", path);
      continue;
    }
    fmt::print("{:<52} {:8.2f} {:9.0f} {:6.1f}% {:8.2f} {} {:8.2f}  {}\n", row.name, row.us, row.gbs,
               100.0 * row.frac_copy, row.tflops, cub, row.copy_us, path);
  }
  if (r.failed) fmt::print("{} case(s) failed their check\n", r.failed);
}

nlohmann::json to_json(const cm::cuda::KernelBenchResult& r) {
  nlohmann::json j;
  j["gpu"] = r.gpu;
  j["copy_gbs"] = r.copy_gbs;
  j["empty_kernel_us"] = r.empty_us;
  j["failed"] = r.failed;
  j["rows"] = nlohmann::json::array();
  for (const auto& row : r.rows) {
    j["rows"].push_back({{"name", row.name},
                         {"family", row.family},
                         {"shape", row.shape},
                         {"check", row.check},
                         {"worst_err_over_tol", row.worst},
                         {"path", row.path},
                         {"M", row.M},
                         {"N", row.N},
                         {"K", row.K},
                         {"groups", row.groups},
                         {"us", row.us},
                         {"copy_us", row.copy_us},
                         {"bytes", row.bytes},
                         {"gbs", row.gbs},
                         {"frac_copy", row.frac_copy},
                         {"tflops", row.tflops},
                         {"cublas_us", row.cublas_us},
                         {"cublas_tflops", row.cublas_tflops},
                         {"speedup_vs_cublas", row.speedup}});
  }
  return j;
}
#endif

#ifdef CLAWMINE_HAVE_CUDA
// The model bench's results as tables; every number is described in the JSON's "notes".
void print_model_table(const nlohmann::json& r) {
  const double mib = 1024.0 * 1024.0;
  fmt::print("GPU: {}   layers: {}   device-to-device copy: {:.0f} GB/s (read + write)\n", r["gpu"].get<std::string>(),
             r["layers"].get<int64_t>(), r["copy_gbs"].get<double>());
  fmt::print("layer count: {}\n\n", r["layers_arithmetic"].get<std::string>());
  fmt::print("device memory (weights)          per layer (MiB)   total (MiB)\n");
  for (auto& [k, v] : r["memory"]["weights"].items()) {
    if (v.is_object())
      fmt::print("  {:<30} {:>15.2f} {:>13.1f}\n", k, v["per_layer"].get<double>() / mib, v["total"].get<double>() / mib);
    else
      fmt::print("  {:<30} {:>15} {:>13.1f}\n", k, "-", v.get<double>() / mib);
  }
  if (r["memory"].contains("bytes_per_slot"))
    for (auto& [k, v] : r["memory"]["bytes_per_slot"].items())
      fmt::print("  state per slot at context {:<7} {:>29.1f}\n", k, v.get<double>() / mib);
  fmt::print("\nprefill (one slot)   tokens   chunk   wall ms     tok/s   GPU ms   GPU tok/s\n");
  for (auto& p : r["prefill"])
    fmt::print("                    {:>7} {:>7} {:>9.1f} {:>9.0f} {:>8.1f} {:>11.0f}\n", p["tokens"].get<int64_t>(),
               p["chunk"].get<int64_t>(), p["wall_ms"].get<double>(), p["tok_s"].get<double>(),
               p["gpu_ms"].get<double>(), p["gpu_tok_s"].get<double>());
  fmt::print("\ndecode   context  batch  step ms   GPU ms    tok/s  us/layer  experts/layer  floor ms  GPU/floor\n");
  for (auto& d : r["decode"])
    fmt::print("        {:>8} {:>6} {:>8.3f} {:>8.3f} {:>8.0f} {:>9.1f} {:>14.1f} {:>9.3f} {:>9.2f}x\n",
               d["context"].get<int64_t>(), d["batch"].get<int64_t>(), d["step_ms"].get<double>(),
               d["gpu_ms"].get<double>(), d["tok_s"].get<double>(), d["us_per_layer"].get<double>(),
               d["expected_experts_per_layer"].get<double>(), d["floor_ms"].get<double>(),
               d["ratio_to_floor"].get<double>());
  if (r.contains("mtp") && !r["mtp"].empty()) {
    fmt::print("\nmtp verify  context  batch  K  rows  step ms   GPU ms   ms/token at acceptance 0.5 / 0.7 / 0.9\n");
    for (auto& m : r["mtp"])
      fmt::print("          {:>9} {:>6} {:>2} {:>5} {:>8.3f} {:>8.3f}   {:>8.3f} {:>8.3f} {:>8.3f}\n",
                 m["context"].get<int64_t>(), m["batch"].get<int64_t>(), m["k"].get<int64_t>(), m["rows"].get<int64_t>(),
                 m["step_ms"].get<double>(), m["gpu_ms"].get<double>(), m["ms_per_token"]["0.5"].get<double>(),
                 m["ms_per_token"]["0.7"].get<double>(), m["ms_per_token"]["0.9"].get<double>());
  }
  const auto print_ops = [](const nlohmann::json& t) {
    for (auto& op : t["ops"])
      fmt::print("  {:<34} {:>5} calls {:>10.1f} us {:>6.1f}%\n", op["op"].get<std::string>(), op["calls"].get<int>(),
                 op["us"].get<double>(), 100.0 * op["share"].get<double>());
  };
  if (r.contains("prefill_top_ops")) {
    const auto& t = r["prefill_top_ops"];
    fmt::print("\ntop ops of one prefill step of {} tokens (event-timed, span {:.1f} us):\n", t["tokens"].get<int64_t>(),
               t["span_us"].get<double>());
    print_ops(t);
  }
  if (r.contains("top_ops"))
    for (auto& t : r["top_ops"]) {
      fmt::print("\ntop ops of one decode step, batch {} context {} (event-timed, span {:.1f} us):\n",
                 t["batch"].get<int64_t>(), t["context"].get<int64_t>(), t["span_us"].get<double>());
      print_ops(t);
    }
  for (auto& s : r["skipped"]) fmt::print("skipped: {}\n", s.get<std::string>());
  for (auto& s : r["errors"]) fmt::print("error: {}\n", s.get<std::string>());
  fmt::print("\nwhat the numbers are:\n");
  for (auto& [k, v] : r["notes"].items()) fmt::print("  {}: {}\n", k, v.get<std::string>());
}

int run_bench_model(const BenchOptions& o) {
  cm::cuda::ModelBenchOptions mo;
  mo.layers = o.layers;
  mo.prefill = o.prefill;
  mo.batches = o.batches;
  mo.contexts = o.contexts;
  mo.repeats = o.repeats;
  mo.warmup = o.warmup;
  mo.prefill_chunk = o.prefill_chunk;
  mo.fill_chunk = o.fill_chunk;
  mo.max_seconds = o.max_seconds;
  mo.json_file = o.json_file;
  mo.fast_prefill = o.fast_prefill;
  mo.sample_on_device = o.sample_on_device;
  mo.concurrent_branches = o.concurrent_branches;
  mo.mtp = o.mtp;
  nlohmann::json r = cm::cuda::run_model_bench(mo);
  if (o.json) fmt::print("{}\n", r.dump(2));
  else print_model_table(r);
  return 0;
}
#endif

int run_bench(const BenchOptions& o) {
  CM_CHECK(o.what == "kernels" || o.what == "model", "bench: unknown target '{}' (available: kernels, model)", o.what);
  if (o.what == "model") {
    CM_CHECK(o.layers >= 0 && o.layers <= 43, "bench model: --layers must be in [0, 43] (0 = as many as fit), got {}",
             o.layers);
#ifdef CLAWMINE_HAVE_CUDA
    if (!cm::device_available(cm::Device::CUDA))
      cm::fail("bench model: no CUDA GPU is available here (the synthetic model runs on the CUDA backend only)");
    return run_bench_model(o);
#else
    cm::fail("bench model: this clawmine was built without the CUDA backend (configure with a CUDA compiler and "
             "-DCLAWMINE_CUDA=ON); the synthetic model runs on the CUDA backend only");
#endif
  }
#ifdef CLAWMINE_HAVE_CUDA
  cm::cuda::KernelBenchOptions ko;
  ko.only = o.only;
  ko.repeats = o.repeats;
  ko.pdl = !o.no_pdl;
  ko.check = o.check;
  ko.seed = o.seed;
  CM_CHECK(o.repeats >= 1, "bench: --repeats must be >= 1");
  if (o.list) {
    const std::vector<std::string> lines = cm::cuda::list_kernel_cases(ko);
    CM_CHECK(!lines.empty(), "bench kernels: no case matches --only '{}'", o.only);
    for (const std::string& l : lines) fmt::print("{}\n", l);
    return 0;
  }
  auto res = cm::cuda::run_kernel_bench(ko);
  if (o.json) fmt::print("{}\n", to_json(res).dump(2));
  else print_table(res);
  if (!o.json_file.empty()) {
    std::FILE* f = std::fopen(o.json_file.c_str(), "w");
    CM_CHECK(f != nullptr, "bench: cannot write --json-file '{}'", o.json_file);
    fmt::print(f, "{}\n", to_json(res).dump(2));
    std::fclose(f);
  }
  return res.failed ? 1 : 0;
#else
  cm::fail("bench kernels: this clawmine was built without the CUDA backend (configure with a CUDA compiler and "
           "-DCLAWMINE_CUDA=ON)");
#endif
}

cm::cli::CommandRegistrar reg({"bench", "Benchmark the GPU kernels or a synthetic V4-Flash model (bench kernels|model)", [](CLI::App& app) {
                                 auto o = std::make_shared<BenchOptions>();
                                 app.add_option("what", o->what, "What to benchmark: kernels, or model (a synthetic V4-Flash on the GPU)")->required();
                                 app.add_flag("--json", o->json, "Print the results as JSON");
                                 app.add_option("--json-file", o->json_file, "Also write the results as JSON here");
                                 app.add_option("--only", o->only,
                                                "kernels: the op-table cases to run, a gtest-style filter "
                                                "(POS:POS-NEG:NEG, * and ?), e.g. 'linear_nvfp4_*_M1_*:moe_*'; "
                                                "default: the table's bench selection (V4-Flash shapes)");
                                 app.add_flag("--list", o->list, "kernels: list the selected cases and exit (no GPU needed)");
                                 app.add_flag("--check", o->check,
                                              "kernels: run each case's correctness check (CPU oracle) before timing it; "
                                              "exit 1 if one fails");
                                 app.add_option("--seed", o->seed, "kernels: seed of the random inputs");
                                 app.add_option("--repeats", o->repeats, "kernels: timed graph launches per measurement; model: timed decode steps per point (prefill: at most 3)");
                                 app.add_option("--layers", o->layers, "model: layers of V4-Flash to build (0 = as many as fit)");
                                 app.add_option("--prefill", o->prefill, "model: prompt lengths to prefill (comma-separated)")->delimiter(',');
                                 app.add_option("--batches", o->batches, "model: decode batch sizes (comma-separated)")->delimiter(',');
                                 app.add_option("--contexts", o->contexts, "model: tokens each slot holds before decode (comma-separated)")->delimiter(',');
                                 app.add_option("--warmup", o->warmup, "model: untimed steps before each decode point");
                                 app.add_option("--prefill-chunk", o->prefill_chunk, "model: tokens per step when prefilling a prompt");
                                 app.add_option("--fill-chunk", o->fill_chunk, "model: tokens per step when filling a slot to a decode context");
                                 app.add_option("--max-seconds", o->max_seconds, "model: skip the points left after this many seconds (0 = no limit)");
                                 app.add_flag("--no-pdl", o->no_pdl,
                                              "Launch the decode kernels without programmatic dependent launch");
                                 app.add_flag("--fast-prefill", o->fast_prefill,
                                              "model: prefill steps over 256 tokens run the quantized linears as "
                                              "BF16 cuBLAS GEMMs (not batch-invariant; as the engine's --fast-prefill)");
                                 app.add_option("--mtp", o->mtp,
                                                "model: MTP verify steps of 1 + K tokens per slot at batch 1 and 8 "
                                                "(comma-separated K values, each in [1, 7])")
                                     ->delimiter(',');
                                 app.add_flag("--sample-on-device,!--no-sample-on-device", o->sample_on_device,
                                              "model: decode steps sample on the device (temperature 1, top-p 0.95; "
                                              "the default, as the engine's) or, with --no-sample-on-device, copy "
                                              "B x vocab logits to the host and sample there");
                                 app.add_flag("--concurrent-branches,!--no-concurrent-branches", o->concurrent_branches,
                                              "model: run a layer's independent branches on a second stream (the "
                                              "default, as the engine's) or every kernel on one stream");
                                 return [o]() -> int { return run_bench(*o); };
                               }});

}  // namespace
