// The CUDA backend's stats observer path and its device-memory budget:
//  - --layer-stats' kind of observer (a stats observer) gets, on the GPU, the
//    CPU's names in the CPU's order, with values computed on the device that
//    agree within the bf16 activations (amax and mean within 5% of the CPU's
//    amax; 25% on the two fixtures with near ties; counts of finite / NaN / Inf
//    values equal), and the step copies no
//    tensor to the host for it (the backend's device-to-host copy count);
//  - --gpu-memory-utilization: a budget too small for the default model is
//    refused with "the model needs X GiB ..., Y GiB available (utilization U of
//    Z GiB total, W GiB free)" before anything is allocated (the device's free
//    memory is unchanged), the default budget loads it, and a reservation past
//    the budget is refused with the same message form;
//  - the observer's large device-to-host copies (the logits) through pinned staging arrive exactly.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <utility>
#include <regex>
#include <string>
#include <vector>

#include "../stats_util.h"
#include "../step_util.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_observer.h"
#include "common/error.h"
#include "factory/factory.h"

namespace {

using namespace cm;

const std::string kData = CLAWMINE_TEST_DATA;

// Two slots of different lengths in one step (slot 0: 5 tokens, slot 1: 6), on `be`.
void mixed_step(ModelBackend& be, int64_t V) {
  std::vector<int32_t> toks(11), pos(11), slot(11);
  std::vector<uint8_t> want(11, 1);
  for (int i = 0; i < 11; ++i)
    toks[size_t(i)] = 3 + 2 * i, slot[size_t(i)] = i < 5 ? 0 : 1, pos[size_t(i)] = i < 5 ? i : i - 5;
  std::vector<float> out(11 * size_t(V));
  be.step(Batch{11, toks.data(), pos.data(), slot.data(), want.data()}, out.data());
}

std::unique_ptr<ModelBackend> observed(const Model& m, Device d, Observer& o) {
  BackendOptions opt;
  opt.observer = &o;
  return test::reserved_backend(m, d, 2, 16, 32, opt);
}

TEST(CudaStats, DeviceStatsMatchTheCpuNamesAndValues) {
  if (!device_available(Device::CUDA)) GTEST_SKIP() << "no CUDA device";
  // hf_mixed_yarn and release_real_ratios flip a router / indexer choice at a near tie under bf16 (see
  // docs/cuda-backend.md, Accuracy), which moves a few rows' intermediates by more than rounding: 25%
  // there, 5% on the fixtures without such ties.
  const std::pair<const char*, double> fixtures[] = {
      {"hf_text", 0.05}, {"hf_hca_window", 0.05}, {"hf_mixed_yarn", 0.25}, {"release_real_ratios", 0.25}};
  for (const auto& [fixture, rel_tol] : fixtures) {
    auto m = model_load(kData + "/golden/" + fixture);
    test::StatsRecorder cpu, gpu;
    mixed_step(*observed(*m, Device::CPU, cpu), m->config.vocab_size);
    mixed_step(*observed(*m, Device::CUDA, gpu), m->config.vocab_size);
    ASSERT_EQ(test::names_of(gpu.seen), test::names_of(cpu.seen)) << fixture;
    float scale = 0;
    for (const test::StatsRecord& r : cpu.seen)
      for (const TensorStats& s : r.stats) scale = std::max(scale, s.amax);
    double worst = 0;
    std::string worst_at;
    for (size_t i = 0; i < cpu.seen.size(); ++i) {
      const auto &c = cpu.seen[i].stats, &g = gpu.seen[i].stats;
      ASSERT_EQ(g.size(), c.size()) << fixture << " " << cpu.seen[i].name;
      for (size_t k = 0; k < c.size(); ++k) {
        const std::string at = std::string(fixture) + " " + cpu.seen[i].name + "[" + std::to_string(k) + "]";
        const double tol = rel_tol * c[k].amax + 1e-4 * scale;
        EXPECT_NEAR(g[k].amax, c[k].amax, tol) << at;
        EXPECT_NEAR(g[k].mean, c[k].mean, tol) << at;
        EXPECT_EQ(g[k].count, c[k].count) << at;
        EXPECT_EQ(g[k].nan, c[k].nan) << at;
        EXPECT_EQ(g[k].inf, c[k].inf) << at;
        const double rel = std::fabs(g[k].amax - c[k].amax) / std::max(double(c[k].amax), 1e-30);
        if (rel > worst) worst = rel, worst_at = at;
      }
    }
    std::printf("  %s: %zu named intermediates, worst amax relative difference %.4f at %s\n", fixture,
                cpu.seen.size(), worst, worst_at.c_str());
  }
}

// The stats path reads back one buffer of results per step besides the logits; a tensor observer
// copies every intermediate (so the count can tell them apart), no observer only the logits.
TEST(CudaStats, StatsPathCopiesNoTensorToTheHost) {
  if (!device_available(Device::CUDA)) GTEST_SKIP() << "no CUDA device";
  auto m = model_load(kData + "/golden/hf_mixed_yarn");
  const int64_t V = m->config.vocab_size;
  test::StatsRecorder stats;
  test::TensorStatsReference tensors;
  auto bs = observed(*m, Device::CUDA, stats);
  auto bt = observed(*m, Device::CUDA, tensors);
  auto bn = test::reserved_backend(*m, Device::CUDA, 2, 16, 32);
  const size_t s0 = cuda_backend_host_copies(*bs), t0 = cuda_backend_host_copies(*bt),
               n0 = cuda_backend_host_copies(*bn);
  mixed_step(*bs, V);
  mixed_step(*bt, V);
  mixed_step(*bn, V);
  size_t results = 0;
  for (const test::StatsRecord& r : stats.seen) results += r.stats.size();
  ASSERT_GT(stats.seen.size(), 20u);
  EXPECT_EQ(stats.seen.size(), tensors.seen.size());
  const size_t readbacks = (results + 4095) / 4096;  // DeviceObserver::kStatsCapacity results per readback
  EXPECT_EQ(cuda_backend_host_copies(*bs) - s0, 1 + readbacks) << results << " statistics";
  EXPECT_GE(cuda_backend_host_copies(*bt) - t0, 1 + tensors.seen.size());
  EXPECT_EQ(cuda_backend_host_copies(*bn) - n0, 1u);
}

// A NaN in a weight: on the device too the stats name layer 1's attention input of slot 1 first,
// with one NaN per row, and arrive before the step throws.
TEST(CudaStats, NonFiniteCountsMatchTheCpu) {
  if (!device_available(Device::CUDA)) GTEST_SKIP() << "no CUDA device";
  test::expect_nan_weight_stats(kData, Device::CUDA);
}

const std::regex kNeeds(
    R"(cuda: the model needs [0-9.]+ GiB of device memory \(.+\), [0-9.]+ GiB available \(utilization [0-9.e+-]+ of )"
    R"([0-9.]+ GiB total, [0-9.]+ GiB free\))");

TEST(CudaMemory, UtilizationBudgetRefusesLoadingAndReserving) {
  if (!device_available(Device::CUDA)) GTEST_SKIP() << "no CUDA device";
  auto m = model_load(kData + "/../../models/default");
  size_t free0 = 0, free1 = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free0, &total), cudaSuccess);
  BackendOptions tiny;
  tiny.gpu_memory_utilization = 1e-6;
  std::string msg = "no error";
  try {
    make_backend(*m, Device::CUDA, tiny);
  } catch (const Error& e) {
    msg = e.what();
  }
  EXPECT_TRUE(std::regex_search(msg, kNeeds)) << msg;
  EXPECT_NE(msg.find("utilization 1e-06 of "), std::string::npos) << msg;
  EXPECT_NE(msg.find("weights "), std::string::npos) << msg;
  ASSERT_EQ(cudaMemGetInfo(&free1, &total), cudaSuccess);
  const double moved = std::fabs(double(free1) - double(free0));
  EXPECT_LE(moved, double(8 << 20)) << "free device memory moved by " << moved << " bytes on a refused load";

  // The default budget loads it and runs a step.
  auto be = make_backend(*m, Device::CUDA);
  be->reserve(CacheShape{1, 8, 256});
  std::vector<int32_t> toks = {5, 9, 3};
  EXPECT_NO_THROW(test::feed_chunks(*be, 0, toks.data(), 3, 0, m->config.vocab_size));
  // More slots than the device holds: refused naming the per-slot state.
  const CacheShape big{1, 8, 4096};
  const size_t per_slot = be->bytes_per_slot(big);
  ASSERT_GT(per_slot, 0u);
  const int64_t slots = std::min<int64_t>(int64_t(total / per_slot) + 1, INT32_MAX);
  msg = "no error";
  try {
    be->reserve(CacheShape{int32_t(slots), 8, 4096});
  } catch (const Error& e) {
    msg = e.what();
  }
  EXPECT_TRUE(std::regex_search(msg, kNeeds)) << msg;
  EXPECT_NE(msg.find("per-slot state"), std::string::npos) << msg;
  // A usable reservation works again afterwards.
  be->reserve(CacheShape{1, 8, 256});
  EXPECT_NO_THROW(test::feed_chunks(*be, 0, toks.data(), 3, 0, m->config.vocab_size));
}

// The observer's device-to-host copy, which returns every step's logits: copies larger than a staging
// half go through the two pinned halves (pieces alternate); sizes around the half and odd byte counts
// arrive exactly, and each call counts as one copy.
TEST(CudaStats, LargeHostCopiesArriveExactly) {
  if (!device_available(Device::CUDA)) GTEST_SKIP() << "no CUDA device";
  cuda::Context ctx;
  cuda::DeviceObserver obs(nullptr);
  obs.reserve();
  const size_t half = size_t(16) << 20;
  for (size_t bytes : {size_t(12), half, half + 1, 2 * half, 2 * half + 4, 5 * half + 12345}) {
    std::vector<uint8_t> h(bytes), back(bytes, 0xAB);
    for (size_t i = 0; i < bytes; ++i) h[i] = uint8_t((i * 2654435761u) >> 13);
    void* d = nullptr;
    ASSERT_EQ(cudaMalloc(&d, bytes), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(d, h.data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
    const size_t before = obs.host_copies();
    obs.to_host(ctx, back.data(), d, bytes);
    EXPECT_EQ(obs.host_copies(), before + 1);
    EXPECT_EQ(std::memcmp(h.data(), back.data(), bytes), 0) << bytes << " bytes";
    cudaFree(d);
  }
}

}  // namespace
