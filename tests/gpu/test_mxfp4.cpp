// The grouped MoE with MXFP4 experts (DeepSeek's release expert format, spec
// 9.3) against the CPU reference of moe_check.h. (The MXFP4 linear is in the
// op table: bench/optable/linear_cases.cpp.)
#include <gtest/gtest.h>

#include "../release_weights.h"
#include "backend/cuda/linear/linear.h"
#include "backend/cuda/moe/moe.h"
#include "gpu_test_util.h"
#include "moe_check.h"

namespace cm {
namespace {

using testw::random_mxfp4;

gputest::Experts make_mxfp4_experts(int count, int64_t hidden, int64_t inter, uint64_t seed) {
  gputest::Experts e;
  for (int i = 0; i < count; ++i) {
    // w1/w3 around 2^-9 .. 2^-5 per block, w2 a little smaller, like trained experts
    e.w1.push_back(random_mxfp4(inter, hidden, seed + 3 * i, 118, 122));
    e.w3.push_back(random_mxfp4(inter, hidden, seed + 3 * i + 1, 118, 122));
    e.w2.push_back(random_mxfp4(hidden, inter, seed + 3 * i + 2, 117, 121));
  }
  return e;
}

// T tokens per entry of ts, ids drawn uniformly from [first - 2, first + count + 2):
// some land outside the local range and must contribute nothing. Each step runs
// on the automatic path and on the prefill kernels.
void run_moe(int64_t hidden, int64_t inter, int count, int first, int topk, float limit, std::initializer_list<int> ts,
             uint64_t seed) {
  cuda::Context ctx;
  gputest::Experts ex = make_mxfp4_experts(count, hidden, inter, seed);
  cuda::DeviceExperts dex =
      cuda::upload_experts(gputest::ptrs(ex.w1), gputest::ptrs(ex.w3), gputest::ptrs(ex.w2), first, limit);
  gputest::Rng r(seed + 1);
  for (int T : ts) {
    std::vector<int32_t> ids(size_t(T * topk));
    for (auto& id : ids) id = int32_t(first - 2 + int(r.next() % uint64_t(count + 4)));
    gputest::check_moe(ctx, ex, dex, hidden, inter, T, topk, ids, seed * 10 + uint64_t(T));
    // the prefill kernels on the same step (the repacked MXFP4 takes them too)
    gputest::check_moe(ctx, ex, dex, hidden, inter, T, topk, ids, seed * 10 + uint64_t(T), false, false,
                       cuda::MoePath::prefill);
  }
}

TEST(GpuMxfp4Moe, SmallShapes) {
  CM_SKIP_WITHOUT_GPU();
  run_moe(256, 128, 8, 4, 3, 1.0f, {1, 2, 5, 17, 40, 100}, 31);
}

TEST(GpuMxfp4Moe, FlashExpertShape) {
  CM_SKIP_WITHOUT_GPU();
  run_moe(4096, 2048, 8, 16, 6, 10.0f, {1, 4, 16}, 41);
}

}  // namespace
}  // namespace cm
