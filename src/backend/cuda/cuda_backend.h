// The CUDA backend: DeepSeek-V4 on one Hopper GPU behind the engine seam
// (engine/backend.h), the same step as the CPU backend (model/cpu_backend.h)
// with bf16 activations into every linear and fp32 everywhere else
// (docs/gpu-ops.md).
//
// Weights live on the device in their stored format (device_model.h). reserve()
// allocates every device buffer once: per-slot state for all slots, layer by
// layer (window ring bf16 [S, W, hd]; compressor pending kv/gate f32
// [S, c·m, c·dc]; entries and indexer keys bf16 [S, max_ctx/m, dc]),
// activations for max_step_tokens rows, MoE scratch, the linear kernels'
// split-K workspace (in the Context), the step plan and the non-finite counts.
// A step copies its plan (token, pos, slot per row; logits rows) in one
// transfer, launches kernels in the CPU step's order and synchronises once, at
// the end, when the logits rows come back. Only with a tensor observer does it
// stop to copy intermediates to the host; a stats observer (--layer-stats) gets
// statistics computed on the device, read back in one copy after the step
// (device_observer.h).
//
// Device memory: loading and reserve() refuse what does not fit in
// min(free, BackendOptions::gpu_memory_utilization · total), naming the parts.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "seam/backend.h"
#include "model/model.h"

namespace cm {

namespace cuda {
struct DevModel;
class OpTimer;
}  // namespace cuda

std::unique_ptr<ModelBackend> make_cuda_backend(const Model& m, const BackendOptions& opt);
// With weights already on the device (made a layer at a time: the synthetic bench,
// bench_model.h); m supplies the config and RoPE tables only. With a timer, each
// step records events through it (op_timer.h; its mode says which).
std::unique_ptr<ModelBackend> make_cuda_backend(const Model& m, std::unique_ptr<cuda::DevModel> dm,
                                                cuda::OpTimer* timer, const BackendOptions& opt = {});
// True when this build has the CUDA backend and a CUDA device is present.
bool cuda_backend_available();
// Makes device `index` this thread's current one (a rank's GPU, before NCCL joins it); fails naming it.
void cuda_use_device(int index);
// Test hook: the device-to-host copies a CUDA backend has made so far (throws for another backend).
size_t cuda_backend_host_copies(const ModelBackend& be);

}  // namespace cm
