// `clawmine bench kernels`: timing of the NVFP4 kernels against a
// device-to-device copy and cuBLAS BF16 measured in the same process.
// Plain C++ interface (no CUDA headers) so the CLI can include it.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace cm::cuda {

struct KernelBenchOptions {
  std::vector<int64_t> ms{1, 4, 16, 64, 256, 4096};
  std::vector<int> moe_tokens{1, 16, 256};
  std::string only;  // substring filter on shape names ("" = all)
  int repeats = 7;   // timed graph launches per measurement (median reported)
  bool pdl = true;   // programmatic dependent launch for the decode kernels (Context's pdl)
};

struct KernelBenchRow {
  std::string kind;  // "linear" or "moe"
  std::string name;  // shape label
  std::string path;  // which kernel served it
  int64_t M = 0, N = 0, K = 0;
  int groups = 1;
  double us = 0;         // median time per call
  double copy_us = 0;    // cudaMemcpy D2D of the same weight bytes, same rotation (per-size copy floor)
  double bytes = 0;      // bytes the call must move (weights + activations + output)
  double gbs = 0;        // bytes / time
  double frac_copy = 0;  // gbs / same-run copy bandwidth
  double tflops = 0;
  double cublas_us = 0, cublas_tflops = 0, speedup = 0;  // cuBLAS BF16 on the same shape (0 = not run)
  int64_t experts_touched = 0;                           // moe only
};

struct KernelBenchResult {
  std::string gpu;
  double copy_gbs = 0;  // device-to-device copy, bytes read + written per second
  double empty_us = 0;  // an empty kernel in the same graph setup: the per-launch floor
  std::vector<KernelBenchRow> rows;
};

// Throws cm::Error when no CUDA device is usable.
KernelBenchResult run_kernel_bench(const KernelBenchOptions& opt);

}  // namespace cm::cuda
