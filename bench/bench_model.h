// `clawmine bench model`: the whole CUDA backend step on a synthetic
// V4-Flash-shaped model (model/synthetic.h) built on the device a layer at a
// time: each layer's attention, compressor, indexer, router and shared-expert
// weights are generated on the host in the release formats, uploaded and freed
// before the next; its 256 routed experts are random NVFP4 generated directly
// on the device (valid E2M1 codes, finite nonzero block scales, a per-expert
// tensor scale). Nothing is written to disk.
//
// What it measures (every number says what it is in the JSON's "notes"):
//  - the device memory per module group and per slot at each context;
//  - prefill tokens/s for one slot and a prompt of P tokens (fed in steps of
//    up to prefill_chunk tokens, logits of the last row only);
//  - decode: one token for each of B slots per step, the slots holding C
//    tokens already (slot 0 filled by prefill steps, the others copies of it);
//    the step's host wall time (including the B x vocab fp32 logits copy to
//    the host and the step's one synchronisation) and its GPU span (CUDA
//    events on the backend's stream from the step's first op to the LM head);
//  - the weight-streaming floor: bytes of weights one decode step must read
//    (every dense weight, the LM head, the shared experts and the expected
//    number of distinct routed experts under uniform routing) over the
//    bandwidth of a same-run 1 GiB device-to-device cudaMemcpy (bytes read +
//    written per second), and the GPU span over that floor;
//  - the top ops of one decode step by GPU time (an event after every op call,
//    op_timer.h; per label, summed over the layers).
// Plain C++ interface (no CUDA headers) so the CLI and tests can include it.
#pragma once
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "seam/backend.h"
#include "model/synthetic.h"

namespace cm::cuda {

class OpTimer;
struct DevBytes;
struct DevModel;

struct ModelBenchOptions {
  SyntheticShape shape;  // V4-Flash by default; shape.layers is the most layers considered
  int64_t layers = 0;    // 0 = as many of Flash's layers as fit next to the largest benchmark's state
  std::vector<int64_t> prefill{2048, 8192};
  std::vector<int64_t> batches{1, 8, 64, 256};
  std::vector<int64_t> contexts{4096, 32768};
  int repeats = 10;               // timed decode steps per point (median); prefill uses min(repeats, 3)
  int warmup = 2;                 // untimed steps before each point
  int64_t prefill_chunk = 8192;   // tokens per step when prefilling a benchmark prompt
  int64_t fill_chunk = 4096;      // tokens per step when filling slot 0 to a decode context
  double max_seconds = 0;         // > 0: points left when this much time has passed are skipped (noted)
  std::string json_file;          // rewritten after every point, so a killed run leaves what it measured
  uint64_t seed = 1;
  bool fast_prefill = false;      // BackendOptions::batch_invariant = false (--fast-prefill)
  bool concurrent_branches = true;  // BackendOptions::concurrent_branches (--no-concurrent-branches: one stream)
  // Decode steps keep their logits on the device and sample there (temperature 1, top-p 0.95):
  // step(batch, nullptr) + sample_last_step, R x 12 bytes back instead of R x vocab floats.
  bool sample_on_device = true;
  // MTP verify steps (--mtp K,...): at each context, for the batches of mtp_batches that ran, steps of
  // 1 + K rows per slot (logits on every row, undoable) each followed by a rollback to one accepted token.
  std::vector<int64_t> mtp;
  std::vector<int64_t> mtp_batches{1, 8};
};

// A synthetic model on the device behind the engine seam.
struct SyntheticDevice {
  std::unique_ptr<Model> model;  // config + RoPE tables (weights live on the device only)
  std::unique_ptr<OpTimer> timer;
  std::unique_ptr<ModelBackend> backend;
  nlohmann::json bytes;          // device bytes per module group, and per layer kind
  size_t expert_bytes = 0;       // one routed expert (w1 + w3 + w2 with scales)
  size_t head_bytes = 0;
  std::vector<size_t> dense_layer_bytes;  // per layer: every weight but the routed experts and tid2eid
  SyntheticDevice();
  ~SyntheticDevice();
};

// Builds shape (all shape.layers layers) on the device. Throws naming the
// memory it needs when the device has too little.
// mtp: with an MTP block (a sliding-window, score-routed layer of the same shape, FP8 e_proj/h_proj).
std::unique_ptr<SyntheticDevice> make_synthetic_device(const SyntheticShape& shape, uint64_t seed,
                                                       bool batch_invariant = true, bool mtp = false,
                                                       bool concurrent_branches = true);

// Every weight of config c generated on the device (as make_synthetic_device: a layer at a time, routed
// experts on the device), with the MTP block when mtp. sd, when given, gets the per-group byte counts.
std::unique_ptr<DevModel> synthetic_dev_model(const Config& c, uint64_t seed, bool mtp, SyntheticDevice* sd = nullptr);

// --load-format dummy on the GPU (model/dummy.h): a CUDA backend over m (a config shell: its config and
// RoPE tables) whose weights are generated on the device; with the MTP block when mtp.
std::unique_ptr<ModelBackend> make_dummy_cuda_backend(const Model& m, const BackendOptions& bo, bool mtp,
                                                      uint64_t seed = 1);

// Runs the benchmark; returns (and writes to json_file) the results. Progress
// goes to stderr. Throws cm::Error when no CUDA device is usable.
nlohmann::json run_model_bench(const ModelBenchOptions& opt);

}  // namespace cm::cuda
