// `clawmine bench kernels [--json]`: times the NVFP4 GPU kernels on
// V4-Flash's shapes against a same-run device copy and cuBLAS BF16 (see
// backend/cuda/bench_kernels.h). Without the CUDA backend it says so and exits 1.
#include <fmt/format.h>

#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "common/error.h"
#ifdef CLAWMINE_HAVE_CUDA
#include "backend/cuda/bench_kernels.h"
#endif

namespace {

struct BenchOptions {
  std::string what;
  bool json = false;
  std::string json_file;
  std::vector<int64_t> ms{1, 4, 16, 64, 256, 4096};
  std::vector<int> moe_tokens{1, 16, 256};
  std::string only;
  int repeats = 7;
  bool no_pdl = false;
};

#ifdef CLAWMINE_HAVE_CUDA
void print_table(const cm::cuda::KernelBenchResult& r) {
  fmt::print("GPU: {}   device-to-device copy: {:.0f} GB/s (read + write)   empty kernel in a graph: {:.2f} us\n",
             r.gpu, r.copy_gbs, r.empty_us);
  fmt::print("{:<26} {:>5} {:>8} {:>9} {:>7} {:>8} {:>10} {:>9} {:>7} {:>8}  {}\n", "shape", "M", "us", "GB/s", "%copy",
             "TFLOP/s", "cuBLAS us", "cuBLAS TF", "speedup", "copy us", "path");
  for (const auto& row : r.rows) {
    std::string cub = row.cublas_us > 0 ? fmt::format("{:10.2f} {:9.1f} {:6.2f}x", row.cublas_us, row.cublas_tflops,
                                                      row.speedup)
                                        : fmt::format("{:>10} {:>9} {:>7}", "-", "-", "-");
    std::string path = row.path;
    if (row.kind == "moe") path += fmt::format(" ({} experts touched)", row.experts_touched);
    fmt::print("{:<26} {:>5} {:8.2f} {:9.0f} {:6.1f}% {:8.2f} {} {:8.2f}  {}\n", row.name, row.M, row.us, row.gbs,
               100.0 * row.frac_copy, row.tflops, cub, row.copy_us, path);
  }
}

nlohmann::json to_json(const cm::cuda::KernelBenchResult& r) {
  nlohmann::json j;
  j["gpu"] = r.gpu;
  j["copy_gbs"] = r.copy_gbs;
  j["empty_kernel_us"] = r.empty_us;
  j["rows"] = nlohmann::json::array();
  for (const auto& row : r.rows) {
    j["rows"].push_back({{"kind", row.kind},
                         {"name", row.name},
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
                         {"speedup_vs_cublas", row.speedup},
                         {"experts_touched", row.experts_touched}});
  }
  return j;
}
#endif

int run_bench(const BenchOptions& o) {
  CM_CHECK(o.what == "kernels", "bench: unknown target '{}' (available: kernels)", o.what);
#ifdef CLAWMINE_HAVE_CUDA
  cm::cuda::KernelBenchOptions ko;
  ko.ms = o.ms;
  ko.moe_tokens = o.moe_tokens;
  ko.only = o.only;
  ko.repeats = o.repeats;
  ko.pdl = !o.no_pdl;
  CM_CHECK(o.repeats >= 1, "bench: --repeats must be >= 1");
  for (int64_t m : o.ms) CM_CHECK(m >= 1, "bench: --m values must be >= 1, got {}", m);
  for (int t : o.moe_tokens) CM_CHECK(t >= 1, "bench: --moe-tokens values must be >= 1, got {}", t);
  auto res = cm::cuda::run_kernel_bench(ko);
  if (o.json) fmt::print("{}\n", to_json(res).dump(2));
  else print_table(res);
  if (!o.json_file.empty()) {
    std::FILE* f = std::fopen(o.json_file.c_str(), "w");
    CM_CHECK(f != nullptr, "bench: cannot write --json-file '{}'", o.json_file);
    fmt::print(f, "{}\n", to_json(res).dump(2));
    std::fclose(f);
  }
  return 0;
#else
  cm::fail("bench kernels: this clawmine was built without the CUDA backend (configure with a CUDA compiler and "
           "-DCLAWMINE_CUDA=ON)");
#endif
}

cm::cli::CommandRegistrar reg({"bench", "Benchmark GPU kernels (bench kernels [--json])", [](CLI::App& app) {
                                 auto o = std::make_shared<BenchOptions>();
                                 app.add_option("what", o->what, "What to benchmark: kernels")->required();
                                 app.add_flag("--json", o->json, "Print the results as JSON");
                                 app.add_option("--json-file", o->json_file, "Also write the results as JSON here");
                                 app.add_option("--m", o->ms, "Token counts M for the linear shapes (comma-separated)")->delimiter(',');
                                 app.add_option("--moe-tokens", o->moe_tokens, "Token counts for the grouped MoE (comma-separated)")->delimiter(',');
                                 app.add_option("--only", o->only, "Only shapes whose name contains this text");
                                 app.add_option("--repeats", o->repeats, "Timed graph launches per measurement");
                                 app.add_flag("--no-pdl", o->no_pdl,
                                              "Launch the decode kernels without programmatic dependent launch");
                                 return [o]() -> int { return run_bench(*o); };
                               }});

}  // namespace
