// `clawmine bench kernels`: times the cases of the GPU op table
// (bench/optable, the same table the GPU tests check) against the device copy
// bandwidth and, for the linears, cuBLAS BF16 on the same shape, measured in
// the same process. Plain C++ interface (no CUDA headers) so the CLI can include it.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace cm::cuda {

struct KernelBenchOptions {
  std::string only;    // gtest-style filter over case names ("" = the table's bench selection)
  int repeats = 7;     // timed graph launches per measurement (median reported)
  bool pdl = true;     // programmatic dependent launch for the decode kernels (Context's pdl)
  bool check = false;  // run each case's correctness check before timing it
  uint64_t seed = 1;   // seed of the random inputs
};

struct KernelBenchRow {
  std::string name;    // the case name (docs/gpu-ops.md)
  std::string family;  // e.g. linear_nvfp4, moe
  std::string shape;   // "N=2048 K=4096 G=1 M=1"
  std::string path;    // which kernel served it
  std::string check;   // "" (not checked), "ok", or the first failure
  double worst = 0;    // checked: the largest error / tolerance seen
  int64_t M = 0, N = 0, K = 0;
  int groups = 1;
  double us = 0;         // median time per call (0: check-only case, not timed)
  double copy_us = 0;    // the weight bytes at the same-run copy bandwidth (the copy floor)
  double bytes = 0;      // bytes the call must move (weights + activations + output)
  double gbs = 0;        // bytes / time
  double frac_copy = 0;  // gbs / same-run copy bandwidth
  double tflops = 0;
  double cublas_us = 0, cublas_tflops = 0, speedup = 0;  // cuBLAS BF16 on the same shape (0 = not run)
};

struct KernelBenchResult {
  std::string gpu;
  double copy_gbs = 0;  // device-to-device copy, bytes read + written per second
  double empty_us = 0;  // an empty kernel in the same graph setup: the per-launch floor
  std::vector<KernelBenchRow> rows;
  int failed = 0;  // cases whose check failed (--check)
};

// One line per case the options select: "name  family  shape  [flags]"; needs no GPU.
std::vector<std::string> list_kernel_cases(const KernelBenchOptions& opt);

// Throws cm::Error when no CUDA device is usable or the filter selects no case.
KernelBenchResult run_kernel_bench(const KernelBenchOptions& opt);

}  // namespace cm::cuda
