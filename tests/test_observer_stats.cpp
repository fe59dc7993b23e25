// The stats observer path (model/observer.h) on the CPU backend: the
// statistics a stats observer receives equal those computed from the full
// tensors a tensor observer receives, with the same names in the same order;
// they are delivered before a non-finite step throws; --layer-stats' scopes;
// the backend options' range check (gpu_memory_utilization).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "common/error.h"
#include "seam/backend.h"
#include "model/model.h"
#include "ops/stats.h"
#include "stats_util.h"
#include "step_util.h"
#include "runtime/layer_stats.h"
#include "backend/observe.h"
#include "factory/factory.h"

namespace {

using namespace cm;

const std::string kData = CLAWMINE_TEST_DATA;

// Two slots of different lengths in one step (slot 0: 5 tokens, slot 1: 6).
void mixed_step(const Model& m, Observer& o) {
  std::vector<int32_t> toks(11), pos(11), slot(11);
  std::vector<uint8_t> want(11, 1);
  for (int i = 0; i < 11; ++i) toks[size_t(i)] = 3 + 2 * i, slot[size_t(i)] = i < 5 ? 0 : 1, pos[size_t(i)] = i < 5 ? i : i - 5;
  BackendOptions opt;
  opt.observer = &o;
  std::vector<float> out(11 * size_t(m.config.vocab_size));
  test::reserved_backend(m, Device::CPU, 2, 16, 32, opt)
      ->step(Batch{11, toks.data(), pos.data(), slot.data(), want.data()}, out.data());
}

TEST(ObserverStats, StatsPathEqualsStatsOfTheFullTensors) {
  for (const char* fixture : {"hf_mixed_yarn", "hf_hca_window"}) {
    auto m = model_load(kData + "/golden/" + fixture);
    test::StatsRecorder stats;
    test::TensorStatsReference ref;
    mixed_step(*m, stats);
    mixed_step(*m, ref);
    ASSERT_EQ(test::names_of(stats.seen), test::names_of(ref.seen)) << fixture;
    size_t streams = 0;
    for (size_t i = 0; i < ref.seen.size(); ++i) {
      const auto &g = stats.seen[i].stats, &r = ref.seen[i].stats;
      ASSERT_EQ(g.size(), r.size()) << ref.seen[i].name;
      for (size_t k = 0; k < r.size(); ++k) {
        const std::string at = std::string(fixture) + " " + ref.seen[i].name + "[" + std::to_string(k) + "]";
        EXPECT_EQ(g[k].amax, r[k].amax) << at;
        EXPECT_NEAR(g[k].mean, r[k].mean, 1e-12 * std::max(1.0, double(r[k].amax))) << at;
        EXPECT_EQ(g[k].count, r[k].count) << at;
        EXPECT_EQ(g[k].nan, r[k].nan) << at;
        EXPECT_EQ(g[k].inf, r[k].inf) << at;
        EXPECT_GT(r[k].count, 0) << at;
      }
      streams += r.size();
    }
    // Every layer's residual is seen per stream: the per-stream path was exercised.
    EXPECT_GT(streams, ref.seen.size()) << fixture;
  }
}

// A NaN in a weight: the stats observer sees it counted at the first intermediate it reaches
// (layer 1's attention input of slot 1, one NaN per row) before the step throws.
TEST(ObserverStats, NonFiniteCountsArriveBeforeTheError) {
  test::expect_nan_weight_stats(kData, Device::CPU);
}

TEST(ObserverStats, LayerStatsScopes) {
  LayerStatsObserver o(stderr);
  EXPECT_FALSE(o.wants_tensors());
  EXPECT_EQ(o.stats_scope("l3.s0.resid", {2, 4, 8}), StatsScope::PER_STREAM);
  EXPECT_EQ(o.stats_scope("l3.s0.attn_out", {2, 8}), StatsScope::WHOLE);
  EXPECT_EQ(o.stats_scope("l3.s0.moe_out", {2, 8}), StatsScope::WHOLE);
  EXPECT_EQ(o.stats_scope("logits", {2, 8}), StatsScope::WHOLE);
  EXPECT_EQ(o.stats_scope("l3.s0.q", {2, 4, 8}), StatsScope::NONE);
  // The layout the device kernel reads for stream k of [T, hc, D].
  const StatsLayout l = stats_layout({3, 4, 8}, StatsScope::PER_STREAM);
  EXPECT_EQ(l.streams, 4);
  EXPECT_EQ(l.rows, 3);
  EXPECT_EQ(l.len, 8);
  EXPECT_EQ(l.stride, 32);
  EXPECT_EQ(l.offset, 8);
  const StatsLayout w = stats_layout({3, 4, 8}, StatsScope::WHOLE);
  EXPECT_EQ(w.streams, 1);
  EXPECT_EQ(w.rows * w.len, 96);
}

TEST(ObserverStats, GpuMemoryUtilizationIsRangeChecked) {
  auto m = model_load(kData + "/golden/hf_text");
  for (double u : {0.0, -0.5, 1.5, double(NAN)}) {
    BackendOptions opt;
    opt.gpu_memory_utilization = u;
    std::string msg = "no error";
    try {
      make_backend(*m, Device::CPU, opt);
    } catch (const Error& e) {
      msg = e.what();
    }
    EXPECT_NE(msg.find("gpu_memory_utilization must be in (0, 1]"), std::string::npos) << u << ": " << msg;
  }
  for (double u : {1e-6, 0.5, 1.0}) {
    BackendOptions opt;
    opt.gpu_memory_utilization = u;
    EXPECT_NO_THROW(make_backend(*m, Device::CPU, opt)) << u;
  }
}

}  // namespace
