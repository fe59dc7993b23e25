// Hands the CUDA backend's named intermediates, which live in device memory,
// to its Observer (model/observer.h):
//  - a tensor observer gets each one copied to the host (a debugging path that
//    stops the step at every intermediate);
//  - a stats observer gets only the statistics it asks for, computed on the
//    device by the stats kernel (ops/stats.h) into a buffer reserved once; the
//    results are read back in one copy after the step (or when the buffer is
//    full) and handed over in the order the intermediates were produced. The
//    tensors never leave the device.
// Every device-to-host copy the backend makes goes through to_host(), which
// counts them: the test that the stats path copies no tensor reads the count.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "backend/cuda/core/cuda_util.h"
#include "seam/observer.h"
#include "ops/stats.h"

namespace cm::cuda {

class DeviceObserver {
 public:
  // Results the stats buffer holds before it is read back mid-step.
  static constexpr int64_t kStatsCapacity = 4096;

  explicit DeviceObserver(Observer* o) : o_(o) {}
  bool active() const { return o_ != nullptr; }
  // Device bytes reserve() takes (0 unless a stats observer).
  size_t reserve_bytes() const;
  // Allocates the stats buffer (the backend's reserve()).
  void reserve();
  // Forgets the results of a step that did not finish.
  void begin_step() {
    pending_.clear();
    used_ = 0;
  }

  // The intermediate `name` of `shape` (rows first) at device address data, f32 or bf16.
  void observe(Context& ctx, const std::string& name, const void* data, bool bf16, const std::vector<int64_t>& shape);
  // Reads back the statistics queued so far and hands them over (after the step's kernels).
  void flush(Context& ctx);

  // Copies device → host on ctx's stream and waits; counted. Copies larger than
  // one staging half (a batch's logits) go through two pinned halves, the host
  // copy out of one overlapping the transfer into the other (a plain copy to
  // pageable memory is staged by the driver one piece at a time).
  void to_host(Context& ctx, void* dst, const void* src, size_t bytes);
  size_t host_copies() const { return copies_; }

 private:
  struct Pending {
    std::string name;
    int64_t first = 0, n = 0;  // results [first, first + n) of the buffer
  };
  Observer* o_;
  DeviceBuffer stats_;  // DeviceTensorStats [kStatsCapacity]
  std::vector<Pending> pending_;
  int64_t used_ = 0;
  std::vector<DeviceTensorStats> host_stats_;
  std::vector<float> f32_;
  std::vector<uint16_t> bf16_;
  size_t copies_ = 0;
  // Pinned staging for large copies: two halves of kStageBytes and an event each, made by reserve().
  static constexpr size_t kStageBytes = size_t(16) << 20;
  struct Stage {
    char* host = nullptr;  // pinned [2 * kStageBytes]
    cudaEvent_t done[2] = {nullptr, nullptr};
    Stage() = default;
    Stage(const Stage&) = delete;
    Stage& operator=(const Stage&) = delete;
    ~Stage();
  } stage_;
};

}  // namespace cm::cuda
