// The model's weights on the GPU, in their stored format (see cuda_backend.h):
// NVFP4 and MXFP4 linears repacked for the FP4 kernels, FP8 blocks for the FP8
// kernels, BF16/F32 linears copied as they are (the batch-invariant dense
// kernel; every linear is a DevLinear of linear/linear.h), routed
// experts as one packed NVFP4/MXFP4 block for the MoE kernels when their shape
// allows it, and every small parameter (norms, mHC, sinks, biases, tid2eid,
// ape, RoPE frequencies) in fp32 / int32.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/cuda/core/cuda_util.h"
#include "backend/cuda/linear/linear.h"
#include "backend/cuda/moe/moe.h"
#include "model/model.h"
#include "ops/linear.h"
#include "ops/rope.h"

namespace cm::cuda {

struct DevF32 {
  DeviceBuffer buf;
  const float* p() const { return buf.as<const float>(); }
};

struct DevCompressor {
  DevLinear wkv, wgate;
  DevF32 ape, norm;
};

struct DevExpert {
  DevLinear w1, w2, w3;
};

struct DevLayer {
  DevF32 hc_attn_fn, hc_attn_base, hc_attn_scale, hc_ffn_fn, hc_ffn_base, hc_ffn_scale;
  DevF32 attn_norm, ffn_norm, q_norm, kv_norm, sinks;
  DevLinear wq_a, wq_b, wkv, wo_a, wo_b;
  std::unique_ptr<DevCompressor> comp, index_comp;  // CSA/HCA; CSA
  DevLinear index_wq_b, index_weights_proj;
  DevLinear gate;
  DevF32 gate_bias;
  DeviceBuffer tid2eid;  // int32 [vocab, k], hash layers
  std::unique_ptr<DeviceExperts> experts;  // packed FP4 block (moe_nvfp4), or
  std::vector<DevExpert> dense_experts;    // one DevLinear triple per held expert (any format): experts
  int64_t dense_first = 0;                 //   dense_first + i (one rank's share under expert parallelism)
  DevExpert shared;
  bool has_shared = false;
};

// Device bytes per module group (the weight report; the synthetic bench's memory table).
struct DevBytes {
  size_t embed = 0, attn = 0, comp = 0, experts = 0, shared = 0, router = 0, small = 0;
  size_t mtp = 0;  // the MTP block's share of the groups above (not added again by total())
  size_t total() const;
};

// The first MTP block (model/weights.h's MtpWeights): its layer and the pieces around it.
struct DevMtp {
  DevLinear e_proj, h_proj;                      // [D, D] each
  DevF32 enorm, hnorm, norm;                     // [D]
  DevF32 hc_head_fn, hc_head_base, hc_head_scale;  // [hc, hc·D], [hc], [1]
  DevLayer block;                                // a sliding-window, score-routed layer
};

struct DevModel {
  DeviceBuffer embed_data, embed_scale;
  DeviceWeightView embed;
  DevLinear head;
  DevF32 norm, hc_head_fn, hc_head_base, hc_head_scale;
  DevF32 rope_main_freqs, rope_compress_freqs;
  RopeView rope_main, rope_compress;
  std::vector<DevLayer> layers;
  std::unique_ptr<DevMtp> mtp;  // loaded with LoadOptions::mtp (else null)
  std::string report;  // bytes per module group, one line each
  size_t total_bytes = 0;
  DevBytes bytes;
};

// The panel scratch run_linear's --fast-prefill path needs for the model's largest FP8/NVFP4 linear.
size_t fast_prefill_panel_bytes(const DevModel& m);

// Device bytes the weights will take (the stored bytes of every tensor).
size_t model_device_bytes(const Model& m);

// The device memory a backend may use (--gpu-memory-utilization): min(free + held,
// utilization·total), where held is what the backend already holds on the device (its
// own, so free to it) and free is what cudaMemGetInfo reports.
struct MemoryBudget {
  size_t free = 0, total = 0, held = 0;
  double utilization = 0.9;
  size_t available() const;
};
// Measures the device now; throws when utilization is outside (0, 1].
MemoryBudget memory_budget(double utilization, size_t held = 0);
// Throws "cuda: the model needs X GiB of device memory (<parts>), Y GiB available (utilization U
// of Z GiB total, W GiB free)" when need > b.available(); W is free + held.
void check_memory(const MemoryBudget& b, size_t need, const std::string& parts);
std::string gib(size_t bytes);  // "1.234 GiB"

// Uploads every weight. Before allocating anything, refuses (check_memory) a model whose
// weights plus `workspace_bytes` (the backend's working buffers) exceed the budget for
// `utilization`; an error while uploading frees what was uploaded. experts: the routed experts
// to upload (one expert-parallel rank's share, which the model must hold); count < 0: all it holds.
std::unique_ptr<DevModel> upload_model(const Model& m, size_t workspace_bytes, double utilization,
                                       const ExpertRange& experts = {});

// upload_model's parts, for a caller that makes the model a layer at a time and
// frees each host layer after its upload (the synthetic bench, bench_model.h):
// the embedding, head, final norms and RoPE; layer L into d.layers[L] (sized to
// the config's layers on first use; a layer holding no routed expert at all
// leaves d.layers[L].experts to the caller); then total_bytes and report.
void upload_globals(const Model& m, DevModel& d);
void upload_layer(const Config& c, const LayerWeights& lw, DevModel& d, int64_t L, const ExpertRange& experts = {});
void upload_layer_into(const Config& c, const LayerWeights& lw, DevLayer& dl, DevBytes& g,
                       const ExpertRange& experts = {});
// An MTP block (its routed experts as upload_layer leaves them: none held, none uploaded).
std::unique_ptr<DevMtp> upload_mtp(const Config& c, const MtpWeights& mw, DevBytes& g);
void finish_report(DevModel& d);

}  // namespace cm::cuda
