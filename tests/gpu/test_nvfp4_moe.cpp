// Grouped NVFP4 MoE on the GPU against the CPU reference of moe_check.h.
// Routing edge cases: experts without tokens, every token on one expert,
// ids outside the local range [first, first+count) (contribute nothing), all
// ids outside (y must be exactly zero).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "backend/cuda/cuda_moe.h"
#include "gpu_test_util.h"
#include "moe_check.h"

namespace cm {
namespace {

using gputest::random_nvfp4;
using gputest::Experts;
using gputest::ptrs;
using gputest::Rng;

Experts make_experts(int count, int64_t hidden, int64_t inter, uint64_t seed) {
  Experts e;
  for (int i = 0; i < count; ++i) {
    e.w1.push_back(random_nvfp4(inter, hidden, seed + 3 * i, 0.02f));
    e.w3.push_back(random_nvfp4(inter, hidden, seed + 3 * i + 1, 0.02f));
    e.w2.push_back(random_nvfp4(hidden, inter, seed + 3 * i + 2, 0.01f));
  }
  return e;
}

TEST(GpuNvfp4Moe, SmallShapesAndRoutingEdgeCases) {
  CM_SKIP_WITHOUT_GPU();
  cuda::Context ctx;
  const int64_t hidden = 256, inter = 128;
  const int count = 8, first = 4, topk = 3;
  Experts ex = make_experts(count, hidden, inter, 11);
  // limit 1.0 so the clamps are exercised on these magnitudes
  cuda::DeviceExperts dex = cuda::upload_experts(ptrs(ex.w1), ptrs(ex.w3), ptrs(ex.w2), first, 1.0f);
  Rng r(5);
  for (int T : {1, 2, 5, 17, 40}) {
    std::vector<int32_t> ids(size_t(T * topk));
    for (auto& id : ids) id = int32_t(r.next() % 16);  // global ids 0..15, local range 4..11
    gputest::check_moe(ctx, ex, dex, hidden, inter, T, topk, ids, 100 + uint64_t(T), false, T >= 5);
  }
  // every token's first choice on one expert (40 tokens: three 16-token passes)
  std::vector<int32_t> one(40 * topk);
  for (int t = 0; t < 40; ++t) {
    one[size_t(t * topk)] = 7;
    one[size_t(t * topk + 1)] = 100;  // out of range
    one[size_t(t * topk + 2)] = -1;   // out of range
  }
  gputest::check_moe(ctx, ex, dex, hidden, inter, 40, topk, one, 7);
  // nothing routed here: y must be exactly zero
  std::vector<int32_t> none(6 * topk, 2);
  gputest::check_moe(ctx, ex, dex, hidden, inter, 6, topk, none, 8, true);
}

TEST(GpuNvfp4Moe, FlashExpertShape) {
  CM_SKIP_WITHOUT_GPU();
  cuda::Context ctx;
  const int64_t hidden = 4096, inter = 2048;
  const int count = 8, first = 16, topk = 6;
  Experts ex = make_experts(count, hidden, inter, 21);
  cuda::DeviceExperts dex = cuda::upload_experts(ptrs(ex.w1), ptrs(ex.w3), ptrs(ex.w2), first, 10.0f);
  Rng r(9);
  for (int T : {1, 4}) {
    std::vector<int32_t> ids(size_t(T * topk));
    for (auto& id : ids) id = int32_t(first - 2 + int(r.next() % (count + 4)));
    gputest::check_moe(ctx, ex, dex, hidden, inter, T, topk, ids, 300 + uint64_t(T));
  }
}

// The top-k sum runs in a fixed order (no float atomics): the same step twice
// gives the same bits, also with many tokens per expert and a PDL chain.
TEST(GpuNvfp4Moe, SameInputsGiveSameBits) {
  CM_SKIP_WITHOUT_GPU();
  cuda::Context ctx;
  const int64_t hidden = 512, inter = 256;
  const int count = 8, topk = 6, T = 64;
  Experts ex = make_experts(count, hidden, inter, 41);
  cuda::DeviceExperts dex = cuda::upload_experts(ptrs(ex.w1), ptrs(ex.w3), ptrs(ex.w2), 0, 10.0f);
  Rng r(42);
  std::vector<int32_t> ids(size_t(T * topk));
  for (int t = 0; t < T; ++t)  // distinct experts per token, some outside the local range
    for (int k = 0; k < topk; ++k) ids[size_t(t * topk + k)] = int32_t((t + 3 * k) % (count + 2));
  std::vector<float> wts(ids.size());
  for (auto& w : wts) w = 0.2f + r.uniform();
  std::vector<uint16_t> xb;
  std::vector<float> xf;
  gputest::random_bf16(size_t(T * hidden), 43, 1.0f, xb, xf);
  cuda::MoeScratch scratch(dex, T, topk);
  cuda::DeviceBuffer dx(xb.size() * 2), dids(ids.size() * 4), dw(wts.size() * 4), dy(size_t(T * hidden) * 4);
  dx.upload(xb.data(), xb.size() * 2);
  dids.upload(ids.data(), ids.size() * 4);
  dw.upload(wts.data(), wts.size() * 4);
  std::vector<uint32_t> first, again(size_t(T * hidden));
  for (int run = 0; run < 3; ++run) {
    cuda::moe_nvfp4(ctx, dex, scratch, dx.as<const uint16_t>(), T, dids.as<const int32_t>(), dw.as<const float>(),
                    dy.as<float>());
    ctx.sync();
    dy.download(again.data(), again.size() * 4);
    if (run == 0) first = again;
    else EXPECT_EQ(first, again) << "run " << run << " differs from run 0";
  }
}

}  // namespace
}  // namespace cm
