// The synthetic model of `clawmine bench model` on the CUDA backend, small:
// the host-built model through the ordinary upload steps with finite logits
// close to the CPU backend's (relative rms error); the bench's own device build (routed experts
// generated on the GPU, layers uploaded one at a time) steps prefill and
// decode with finite logits; and the whole bench on a tiny shape fills every
// table of its JSON. Skipped without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "../step_util.h"
#include "bench/bench_model.h"
#include "seam/backend.h"
#include "model/synthetic.h"
#include "factory/factory.h"

using namespace cm;

TEST(BenchModelGpu, TinySyntheticMatchesCpu) {
  if (!device_available(Device::CUDA)) GTEST_SKIP() << "no CUDA device";
  auto m = synthetic_model(synthetic_tiny_shape(), 5);
  const int64_t V = m->config.vocab_size, T = 24;
  std::vector<int32_t> toks(static_cast<size_t>(T));
  for (int64_t i = 0; i < T; ++i) toks[size_t(i)] = int32_t((i * 53 + 11) % V);
  const std::vector<float> cpu = test::cpu_logits(*m, toks, 0);
  auto be = test::reserved_backend(*m, Device::CUDA, 1, int32_t(T), 64);
  const std::vector<float> gpu = test::feed_chunks(*be, 0, toks.data(), T, 0, V);
  // bf16 activations on the GPU may flip a near-tied expert choice for a token, so the check is the
  // relative rms error over all rows rather than each element.
  double amax = 0, d = 0, ref = 0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    ASSERT_TRUE(std::isfinite(gpu[i]));
    amax = std::max(amax, double(std::fabs(cpu[i])));
    d += (double(gpu[i]) - cpu[i]) * (double(gpu[i]) - cpu[i]);
    ref += double(cpu[i]) * cpu[i];
  }
  const double rel = std::sqrt(d / ref);
  std::printf("  tiny synthetic: rms |cuda - cpu| / rms |cpu| = %.3g, max |logit| %.3g\n", rel, amax);
  EXPECT_GT(amax, 1e-3);
  EXPECT_LE(rel, 0.1);
}

TEST(BenchModelGpu, DeviceBuiltModelPrefillsAndDecodes) {
  if (!device_available(Device::CUDA)) GTEST_SKIP() << "no CUDA device";
  const SyntheticShape s = synthetic_tiny_shape();
  auto sd = cuda::make_synthetic_device(s, 9);
  const Config& c = sd->model->config;
  const int64_t V = c.vocab_size;
  EXPECT_EQ(sd->bytes["routed_experts"]["total"].get<size_t>(),
            sd->expert_bytes * size_t(c.n_routed_experts * c.num_layers) + size_t(c.num_layers * c.n_routed_experts * 3 * 4));
  ModelBackend& be = *sd->backend;
  be.reserve(CacheShape{3, 16, 128});
  std::vector<int32_t> toks(40);
  for (size_t i = 0; i < toks.size(); ++i) toks[i] = int32_t((i * 29 + 3) % size_t(V));
  const std::vector<float> pre = test::feed_chunks(be, 0, toks.data(), 40, 16, V);  // throws if non-finite
  for (float x : pre) ASSERT_TRUE(std::isfinite(x));
  be.copy_slot(0, 1);
  be.copy_slot(0, 2);
  // One decode step over three slots; slots 1 and 2 hold the same state and get the same token: same bits.
  const int32_t tok[3] = {7, 9, 9}, pos[3] = {40, 40, 40}, slot[3] = {0, 1, 2};
  const uint8_t want[3] = {1, 1, 1};
  std::vector<float> out(size_t(3 * V));
  be.step(Batch{3, tok, pos, slot, want}, out.data());
  for (float x : out) ASSERT_TRUE(std::isfinite(x));
  EXPECT_TRUE(std::equal(out.begin() + V, out.begin() + 2 * V, out.begin() + 2 * V));
  EXPECT_FALSE(std::equal(out.begin(), out.begin() + V, out.begin() + V));
  EXPECT_EQ(be.slot_pos(2), 41);
}

TEST(BenchModelGpu, TinyBenchFillsEveryTable) {
  if (!device_available(Device::CUDA)) GTEST_SKIP() << "no CUDA device";
  cuda::ModelBenchOptions o;
  o.shape = synthetic_tiny_shape();
  o.prefill = {32};
  o.batches = {1, 3};
  o.contexts = {40};
  o.repeats = 2;
  o.warmup = 1;
  o.prefill_chunk = 16;
  o.fill_chunk = 16;
  const nlohmann::json r = cuda::run_model_bench(o);
  EXPECT_EQ(r["layers"].get<int64_t>(), 2);
  EXPECT_TRUE(r["errors"].empty()) << r["errors"].dump();
  ASSERT_EQ(r["prefill"].size(), 1u);
  EXPECT_GT(r["prefill"][0]["tok_s"].get<double>(), 0.0);
  ASSERT_EQ(r["decode"].size(), 2u);
  for (const auto& d : r["decode"]) {
    EXPECT_GT(d["gpu_ms"].get<double>(), 0.0);
    EXPECT_GE(d["step_ms"].get<double>(), d["gpu_ms"].get<double>() * 0.5);
    EXPECT_GT(d["floor_ms"].get<double>(), 0.0);
    EXPECT_GT(d["ratio_to_floor"].get<double>(), 0.0);
  }
  EXPECT_NEAR(r["decode"][0]["expected_experts_per_layer"].get<double>(), 2.0, 1e-9);  // B = 1: exactly K
  ASSERT_TRUE(r.contains("top_ops"));
  ASSERT_FALSE(r["top_ops"][0]["ops"].empty());
  double share = 0;
  for (const auto& op : r["top_ops"][0]["ops"]) share += op["share"].get<double>();
  EXPECT_GT(share, 0.2);  // the top 10 of the ~41 op labels hold at least a quarter by pigeonhole
  EXPECT_LE(share, 1.0 + 1e-6);
  EXPECT_GT(r["copy_gbs"].get<double>(), 100.0);
  ASSERT_TRUE(r.contains("prefill_top_ops"));  // one profiled prefill step of the first prompt's chunk
  EXPECT_EQ(r["prefill_top_ops"]["tokens"].get<int64_t>(), 16);
  EXPECT_FALSE(r["prefill_top_ops"]["ops"].empty());
}
