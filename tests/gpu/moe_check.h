// Shared check of the grouped MoE GPU tests (NVFP4 and MXFP4 experts): a CPU
// reference built from linear_cpu,
//   h = bf16(silu(min(g, L)) * clamp(u, -L, L) * w_k),  y[t] = sum_k h . w2^T,
// and one moe_nvfp4 call on given routing against it.
// Bound: ||y - ref|| / ||ref|| <= 1e-2, every output finite.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cuda/moe/moe.h"
#include "gpu_test_util.h"

namespace cm::gputest {

struct Experts {
  std::vector<LinearWeight> w1, w3, w2;
};

// y of token t alone (hidden floats); counts the clamped SwiGLU inputs.
inline std::vector<float> moe_reference_token(const Experts& ex, int first, float limit, const float* xt, int64_t hidden,
                                              int64_t inter, const int32_t* ids_t, const float* wts_t, int topk,
                                              int64_t* clamped) {
  std::vector<float> y(static_cast<size_t>(hidden), 0.f);
  std::vector<float> g(static_cast<size_t>(inter)), u(g), h(g), o(static_cast<size_t>(hidden));
  for (int k = 0; k < topk; ++k) {
    const int le = ids_t[k] - first;
    if (le < 0 || le >= int(ex.w1.size())) continue;
    linear_cpu(ex.w1[size_t(le)], xt, 1, g.data());
    linear_cpu(ex.w3[size_t(le)], xt, 1, u.data());
    for (int64_t i = 0; i < inter; ++i) {
      if (g[size_t(i)] > limit || std::fabs(u[size_t(i)]) > limit) ++*clamped;
      const float gg = std::min(g[size_t(i)], limit);
      const float uu = std::clamp(u[size_t(i)], -limit, limit);
      h[size_t(i)] = round_bf16(gg / (1.0f + std::exp(-gg)) * uu * wts_t[k]);
    }
    linear_cpu(ex.w2[size_t(le)], h.data(), 1, o.data());
    for (int64_t i = 0; i < hidden; ++i) y[size_t(i)] += o[size_t(i)];
  }
  return y;
}

inline std::vector<float> moe_reference(const Experts& ex, int first, float limit, const std::vector<float>& x, int T,
                                        int64_t hidden, int64_t inter, const std::vector<int32_t>& ids,
                                        const std::vector<float>& wts, int topk, int64_t* clamped) {
  std::vector<float> y(static_cast<size_t>(T * hidden), 0.f);
  for (int t = 0; t < T; ++t) {
    const std::vector<float> yt = moe_reference_token(ex, first, limit, &x[size_t(t * hidden)], hidden, inter,
                                                      &ids[size_t(t * topk)], &wts[size_t(t * topk)], topk, clamped);
    std::copy(yt.begin(), yt.end(), y.begin() + t * hidden);
  }
  return y;
}

inline std::vector<const LinearWeight*> ptrs(const std::vector<LinearWeight>& v) {
  std::vector<const LinearWeight*> p;
  for (auto& w : v) p.push_back(&w);
  return p;
}

// Runs T tokens with the given routing and compares with the reference.
inline void check_moe(cuda::Context& ctx, const Experts& ex, const cuda::DeviceExperts& dex, int64_t hidden,
                      int64_t inter, int T, int topk, const std::vector<int32_t>& ids, uint64_t seed,
                      bool expect_zero = false, bool expect_clamps = false,
                      cuda::MoePath path = cuda::MoePath::automatic) {
  SCOPED_TRACE(testing::Message() << "T=" << T << " hidden=" << hidden << " inter=" << inter << " path="
                             << int(path));
  Rng r(seed);
  std::vector<float> wts(ids.size());
  for (auto& w : wts) w = 0.2f + r.uniform();
  std::vector<uint16_t> xb;
  std::vector<float> xf;
  random_bf16(size_t(T * hidden), seed + 1, 1.0f, xb, xf);
  int64_t clamped = 0;
  const std::vector<float> ref =
      moe_reference(ex, dex.first, dex.swiglu_limit, xf, T, hidden, inter, ids, wts, topk, &clamped);
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
                  dy.as<float>(), path);
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

}  // namespace cm::gputest
