// The CUDA backend's observer path (see device_observer.h).
#include "backend/cuda/device_observer.h"

#include <algorithm>
#include <cstring>

#include "backend/cuda/core/cuda_errors.h"
#include "backend/observe.h"

namespace cm::cuda {

namespace {

float bf16_to_f32(uint16_t h) {
  const uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace

size_t DeviceObserver::reserve_bytes() const {
  return o_ && !o_->wants_tensors() ? size_t(kStatsCapacity) * sizeof(DeviceTensorStats) : 0;
}

DeviceObserver::Stage::~Stage() {
  for (cudaEvent_t e : done)
    if (e) cudaEventDestroy(e);
  if (host) cudaFreeHost(host);
}

void DeviceObserver::reserve() {
  begin_step();
  if (!stage_.host) {
    CM_CUDA(cudaMallocHost(reinterpret_cast<void**>(&stage_.host), 2 * kStageBytes));
    for (cudaEvent_t& e : stage_.done) CM_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
  if (reserve_bytes() == 0) return;
  if (stats_.size() < reserve_bytes()) stats_.alloc(reserve_bytes());
  host_stats_.resize(size_t(kStatsCapacity));
}

void DeviceObserver::observe(Context& ctx, const std::string& name, const void* data, bool bf16,
                             const std::vector<int64_t>& shape) {
  if (!o_) return;
  int64_t count = 1;
  for (int64_t d : shape) count *= d;
  if (o_->wants_tensors()) {
    f32_.resize(size_t(count));
    if (bf16) {
      bf16_.resize(size_t(count));
      to_host(ctx, bf16_.data(), data, size_t(count) * 2);
      for (size_t i = 0; i < size_t(count); ++i) f32_[i] = bf16_to_f32(bf16_[i]);
    } else {
      to_host(ctx, f32_.data(), data, size_t(count) * 4);
    }
    o_->observe(name, f32_.data(), shape);
    return;
  }
  const StatsScope scope = o_->stats_scope(name, shape);
  if (scope == StatsScope::NONE) return;
  const StatsLayout l = stats_layout(shape, scope);
  CM_CU_CHECK(l.streams <= kStatsCapacity, "observer: '%s' asks for %lld statistics, more than the %lld reserved",
              name.c_str(), (long long)l.streams, (long long)kStatsCapacity);
  CM_CU_CHECK(stats_.size() >= reserve_bytes(), "observer: the stats buffer is not reserved (call reserve first)");
  if (used_ + l.streams > kStatsCapacity) flush(ctx);
  DeviceTensorStats* out = stats_.as<DeviceTensorStats>() + used_;
  for (int64_t k = 0; k < l.streams; ++k) {
    if (bf16)
      tensor_stats_cuda(ctx, static_cast<const uint16_t*>(data) + k * l.offset, l.rows, l.len, l.stride, out + k);
    else
      tensor_stats_cuda(ctx, static_cast<const float*>(data) + k * l.offset, l.rows, l.len, l.stride, out + k);
  }
  pending_.push_back(Pending{name, used_, l.streams});
  used_ += l.streams;
}

void DeviceObserver::flush(Context& ctx) {
  if (pending_.empty()) return;
  to_host(ctx, host_stats_.data(), stats_.get(), size_t(used_) * sizeof(DeviceTensorStats));
  std::vector<TensorStats> s;
  for (const Pending& p : pending_) {
    s.clear();
    for (int64_t i = p.first; i < p.first + p.n; ++i) s.push_back(to_tensor_stats(host_stats_[size_t(i)]));
    o_->observe_stats(p.name, s);
  }
  begin_step();
}

void DeviceObserver::to_host(Context& ctx, void* dst, const void* src, size_t bytes) {
  ++copies_;
  if (bytes <= kStageBytes || !stage_.host) {
    CM_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, ctx.stream()));
    CM_CUDA(cudaStreamSynchronize(ctx.stream()));
    return;
  }
  // Pieces alternate between the halves: piece i + 1 is in flight while piece i is copied out, and a
  // half is refilled only after its copy-out (host order).
  size_t len[2] = {0, 0}, at[2] = {0, 0}, off = 0;
  const auto issue = [&](int k) {
    len[k] = std::min(kStageBytes, bytes - off);
    if (len[k] == 0) return;
    at[k] = off;
    off += len[k];
    CM_CUDA(cudaMemcpyAsync(stage_.host + size_t(k) * kStageBytes, static_cast<const char*>(src) + at[k], len[k],
                            cudaMemcpyDeviceToHost, ctx.stream()));
    CM_CUDA(cudaEventRecord(stage_.done[k], ctx.stream()));
  };
  issue(0);
  issue(1);
  for (int k = 0; len[k] > 0; k ^= 1) {
    CM_CUDA(cudaEventSynchronize(stage_.done[k]));
    std::memcpy(static_cast<char*>(dst) + at[k], stage_.host + size_t(k) * kStageBytes, len[k]);
    issue(k);
  }
}

}  // namespace cm::cuda
