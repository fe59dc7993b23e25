// Grouped NVFP4 MoE on the GPU against a CPU reference built from linear_cpu:
// h = bf16(silu(min(g, L)) * clamp(u, -L, L) * w_k), y[t] = sum_k h . w2^T.
// Routing edge cases: experts without tokens, every token on one expert,
// ids outside the local range [first, first+count) (contribute nothing), all
// ids outside (y must be exactly zero). Bound: ||y - ref|| / ||ref|| <= 1e-2.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "backend/cuda/cuda_moe.h"
#include "gpu_test_util.h"

namespace cm {
namespace {

using gputest::random_bf16;
using gputest::random_nvfp4;
using gputest::rel_error;
using gputest::Rng;

struct Experts {
  std::vector<LinearWeight> w1, w3, w2;
};

Experts make_experts(int count, int64_t hidden, int64_t inter, uint64_t seed) {
  Experts e;
  for (int i = 0; i < count; ++i) {
    e.w1.push_back(random_nvfp4(inter, hidden, seed + 3 * i, 0.02f));
    e.w3.push_back(random_nvfp4(inter, hidden, seed + 3 * i + 1, 0.02f));
    e.w2.push_back(random_nvfp4(hidden, inter, seed + 3 * i + 2, 0.01f));
  }
  return e;
}

std::vector<float> reference(const Experts& ex, int first, float limit, const std::vector<float>& x, int T, int64_t hidden,
                             int64_t inter, const std::vector<int32_t>& ids, const std::vector<float>& wts, int topk,
                             int64_t* clamped) {
  std::vector<float> y(static_cast<size_t>(T * hidden), 0.f);
  std::vector<float> g(static_cast<size_t>(inter)), u(g), h(g), o(static_cast<size_t>(hidden));
  for (int t = 0; t < T; ++t) {
    for (int k = 0; k < topk; ++k) {
      const int le = ids[size_t(t * topk + k)] - first;
      if (le < 0 || le >= int(ex.w1.size())) continue;
      const float* xt = &x[size_t(t * hidden)];
      linear_cpu(ex.w1[size_t(le)], xt, 1, g.data());
      linear_cpu(ex.w3[size_t(le)], xt, 1, u.data());
      for (int64_t i = 0; i < inter; ++i) {
        if (g[size_t(i)] > limit || std::fabs(u[size_t(i)]) > limit) ++*clamped;
        const float gg = std::min(g[size_t(i)], limit);
        const float uu = std::clamp(u[size_t(i)], -limit, limit);
        h[size_t(i)] = round_bf16(gg / (1.0f + std::exp(-gg)) * uu * wts[size_t(t * topk + k)]);
      }
      linear_cpu(ex.w2[size_t(le)], h.data(), 1, o.data());
      for (int64_t i = 0; i < hidden; ++i) y[size_t(t * hidden + i)] += o[size_t(i)];
    }
  }
  return y;
}

std::vector<const LinearWeight*> ptrs(const std::vector<LinearWeight>& v) {
  std::vector<const LinearWeight*> p;
  for (auto& w : v) p.push_back(&w);
  return p;
}

// Runs T tokens with the given routing and compares with the reference.
void check(cuda::Context& ctx, const Experts& ex, const cuda::DeviceExperts& dex, int64_t hidden, int64_t inter,
           int T, int topk, const std::vector<int32_t>& ids, uint64_t seed, bool expect_zero = false,
           bool expect_clamps = false) {
  SCOPED_TRACE(testing::Message() << "T=" << T << " hidden=" << hidden << " inter=" << inter);
  Rng r(seed);
  std::vector<float> wts(ids.size());
  for (auto& w : wts) w = 0.2f + r.uniform();
  std::vector<uint16_t> xb;
  std::vector<float> xf;
  random_bf16(size_t(T * hidden), seed + 1, 1.0f, xb, xf);
  int64_t clamped = 0;
  const std::vector<float> ref =
      reference(ex, dex.first, dex.swiglu_limit, xf, T, hidden, inter, ids, wts, topk, &clamped);
  if (expect_clamps) {
    EXPECT_GT(clamped, 0) << "test inputs never reach the SwiGLU limit";
  }
  cuda::MoeScratch scratch(dex, T, topk);
  cuda::DeviceBuffer dx(xb.size() * 2), dids(ids.size() * 4), dw(wts.size() * 4), dy(size_t(T * hidden) * 4);
  dx.upload(xb.data(), xb.size() * 2);
  dids.upload(ids.data(), ids.size() * 4);
  dw.upload(wts.data(), wts.size() * 4);
  CM_CUDA(cudaMemset(dy.get(), 0x7f, dy.size()));  // NaN-like garbage: the kernel must overwrite it
  cuda::moe_nvfp4(ctx, dex, scratch, dx.as<const uint16_t>(), T, dids.as<const int32_t>(), dw.as<const float>(),
                  dy.as<float>());
  ctx.sync();
  std::vector<float> y(size_t(T * hidden));
  dy.download(y.data(), y.size() * 4);
  if (expect_zero) {
    for (float v : y) ASSERT_EQ(v, 0.0f);
    return;
  }
  int64_t nonfinite = 0;
  EXPECT_LE(rel_error(y, ref, &nonfinite), 1e-2);
  EXPECT_EQ(nonfinite, 0);
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
    check(ctx, ex, dex, hidden, inter, T, topk, ids, 100 + uint64_t(T), false, T >= 5);
  }
  // every token's first choice on one expert (40 tokens: three 16-token passes)
  std::vector<int32_t> one(40 * topk);
  for (int t = 0; t < 40; ++t) {
    one[size_t(t * topk)] = 7;
    one[size_t(t * topk + 1)] = 100;  // out of range
    one[size_t(t * topk + 2)] = -1;   // out of range
  }
  check(ctx, ex, dex, hidden, inter, 40, topk, one, 7);
  // nothing routed here: y must be exactly zero
  std::vector<int32_t> none(6 * topk, 2);
  check(ctx, ex, dex, hidden, inter, 6, topk, none, 8, true);
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
    check(ctx, ex, dex, hidden, inter, T, topk, ids, 300 + uint64_t(T));
  }
}

}  // namespace
}  // namespace cm
