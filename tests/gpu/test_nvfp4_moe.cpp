// Grouped NVFP4 MoE on the GPU against the CPU reference of moe_check.h.
// Routing edge cases: experts without tokens, every token on one expert,
// ids outside the local range [first, first+count) (contribute nothing), all
// ids outside (y must be exactly zero).
// The prefill kernels (forced on any T, and chosen automatically from
// kMoePrefillMinTokens tokens) against the same reference, and bit for bit
// against the decode kernels on the same tokens, on the same tokens in other
// batches (chunks of 7, uneven splits), and against themselves (run twice).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "backend/cuda/moe/moe.h"
#include "gpu_test_util.h"
#include "moe_check.h"
#include "op_check.h"

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

// One step's inputs on the host and the device: bf16 x, ids, routing weights.
struct MoeInputs {
  int T = 0, topk = 0;
  int64_t hidden = 0;
  std::vector<int32_t> ids;
  std::vector<float> wts, xf;
  std::vector<uint16_t> xb;
  cuda::DeviceBuffer dx, dids, dw;
};

MoeInputs make_inputs(int T, int topk, int64_t hidden, std::vector<int32_t> ids, uint64_t seed) {
  MoeInputs in;
  in.T = T;
  in.topk = topk;
  in.hidden = hidden;
  in.ids = std::move(ids);
  Rng r(seed);
  in.wts.resize(in.ids.size());
  for (auto& w : in.wts) w = 0.2f + r.uniform();
  gputest::random_bf16(size_t(T * hidden), seed + 1, 1.0f, in.xb, in.xf);
  in.dx.alloc(in.xb.size() * 2);
  in.dids.alloc(in.ids.size() * 4);
  in.dw.alloc(in.wts.size() * 4);
  in.dx.upload(in.xb.data(), in.xb.size() * 2);
  in.dids.upload(in.ids.data(), in.ids.size() * 4);
  in.dw.upload(in.wts.data(), in.wts.size() * 4);
  return in;
}

// y of tokens [t0, t0 + n) of `in`, in one call on `path`, into a guarded
// output (starts as NaN bytes; writes outside it fail the test).
std::vector<float> run_moe(cuda::Context& ctx, const cuda::DeviceExperts& dex, cuda::MoeScratch& s,
                           const MoeInputs& in, int t0, int n, cuda::MoePath path) {
  gputest::Guarded<float> y(size_t(n) * size_t(in.hidden));
  cuda::moe_nvfp4(ctx, dex, s, in.dx.as<const uint16_t>() + int64_t(t0) * in.hidden, n,
                  in.dids.as<const int32_t>() + int64_t(t0) * in.topk, in.dw.as<const float>() + int64_t(t0) * in.topk,
                  y.ptr(), path);
  ctx.sync();
  return y.get();
}

// The number of elements whose bits differ.
size_t bit_diffs(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  size_t d = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    uint32_t ua, ub;
    std::memcpy(&ua, &a[i], 4);
    std::memcpy(&ub, &b[i], 4);
    d += ua != ub;
  }
  return d;
}

// The whole step on the prefill path, by decode chunks of 7 tokens, and by
// prefill chunks split unevenly: every token's row has the same bits.
void expect_batch_invariant(cuda::Context& ctx, const cuda::DeviceExperts& dex, cuda::MoeScratch& s,
                            const MoeInputs& in, const std::vector<float>& whole) {
  std::vector<float> by7, split;
  for (int t0 = 0; t0 < in.T; t0 += 7) {
    const std::vector<float> c = run_moe(ctx, dex, s, in, t0, std::min(7, in.T - t0), cuda::MoePath::automatic);
    by7.insert(by7.end(), c.begin(), c.end());
  }
  EXPECT_EQ(bit_diffs(by7, whole), 0u) << "chunks of 7 tokens (decode kernels) differ from one prefill";
  const int cut = std::max(1, in.T / 3 + 5);
  for (auto [t0, n] : {std::pair{0, cut}, std::pair{cut, in.T - cut}}) {
    if (n <= 0) continue;
    const std::vector<float> c = run_moe(ctx, dex, s, in, t0, n, cuda::MoePath::prefill);
    split.insert(split.end(), c.begin(), c.end());
  }
  EXPECT_EQ(bit_diffs(split, whole), 0u) << "prefill split at token " << cut << " differs from one prefill";
}

// Prefill against the CPU reference (tokens `check`, all when empty), and bit
// for bit against the decode kernels, the automatic path and a second run.
void check_prefill(cuda::Context& ctx, const Experts& ex, const cuda::DeviceExperts& dex, cuda::MoeScratch& s,
                   const MoeInputs& in, std::vector<int> check = {}, bool expect_zero = false) {
  SCOPED_TRACE(testing::Message() << "prefill T=" << in.T << " hidden=" << dex.hidden << " inter=" << dex.inter);
  const std::vector<float> pf = run_moe(ctx, dex, s, in, 0, in.T, cuda::MoePath::prefill);
  const std::vector<float> dec = run_moe(ctx, dex, s, in, 0, in.T, cuda::MoePath::decode);
  EXPECT_EQ(bit_diffs(pf, dec), 0u) << "prefill and decode kernels differ";
  EXPECT_EQ(bit_diffs(pf, run_moe(ctx, dex, s, in, 0, in.T, cuda::MoePath::prefill)), 0u) << "second run differs";
  EXPECT_EQ(bit_diffs(pf, run_moe(ctx, dex, s, in, 0, in.T, cuda::MoePath::automatic)), 0u) << "automatic path";
  if (expect_zero) {
    for (float v : pf) ASSERT_EQ(v, 0.0f);
    return;
  }
  if (ex.w1.empty()) return;  // device-only experts: no CPU reference
  if (check.empty())
    for (int t = 0; t < in.T; ++t) check.push_back(t);
  std::vector<float> got, ref;
  int64_t clamped = 0;
  for (int t : check) {
    const std::vector<float> r =
        gputest::moe_reference_token(ex, dex.first, dex.swiglu_limit, &in.xf[size_t(t * in.hidden)], dex.hidden,
                                     dex.inter, &in.ids[size_t(t * in.topk)], &in.wts[size_t(t * in.topk)], in.topk,
                                     &clamped);
    ref.insert(ref.end(), r.begin(), r.end());
    got.insert(got.end(), pf.begin() + int64_t(t) * in.hidden, pf.begin() + int64_t(t + 1) * in.hidden);
  }
  int64_t nonfinite = 0;
  EXPECT_LE(gputest::rel_error(got, ref, &nonfinite), 1e-2);
  EXPECT_EQ(nonfinite, 0);
}

// Small and odd shapes (K chunks not a multiple of 4: idle K-split warps and
// a partial last stage), token counts around the 64-token tile, and routing
// edge cases; limit 1.0 exercises the SwiGLU clamps.
TEST(GpuNvfp4MoePrefill, SmallShapesMatchReferenceAndDecodeBits) {
  CM_SKIP_WITHOUT_GPU();
  cuda::Context ctx;
  const int count = 8, first = 4, topk = 3;
  for (auto [hidden, inter] : {std::pair<int64_t, int64_t>{256, 128}, std::pair<int64_t, int64_t>{320, 192}}) {
    Experts ex = make_experts(count, hidden, inter, 51 + uint64_t(hidden));
    cuda::DeviceExperts dex = cuda::upload_experts(ptrs(ex.w1), ptrs(ex.w3), ptrs(ex.w2), first, 1.0f);
    cuda::MoeScratch s(dex, 200, topk);
    Rng r(6);
    for (int T : {1, 7, 64, 65, 200}) {  // global ids 0..15, local 4..11: repeats, misses, empty experts
      std::vector<int32_t> ids(size_t(T * topk));
      for (auto& id : ids) id = int32_t(r.next() % 16);
      check_prefill(ctx, ex, dex, s, make_inputs(T, topk, hidden, ids, 200 + uint64_t(T)));
    }
    // every token's first choice on expert 7 (200 tokens: tiles of 64, 64, 64, 8)
    std::vector<int32_t> one(200 * topk);
    for (int t = 0; t < 200; ++t) {
      one[size_t(t * topk)] = 7;
      one[size_t(t * topk + 1)] = 100;  // out of range
      one[size_t(t * topk + 2)] = t % 2 ? -1 : 11;
    }
    const MoeInputs in_one = make_inputs(200, topk, hidden, one, 17);
    check_prefill(ctx, ex, dex, s, in_one);
    // two experts, repeated within tokens; six local experts get no token
    std::vector<int32_t> two(130 * topk);
    for (size_t i = 0; i < two.size(); ++i) two[i] = int32_t(4 + (i * 7 / 5) % 2);
    check_prefill(ctx, ex, dex, s, make_inputs(130, topk, hidden, two, 18));
    // nothing routed here: y must be exactly zero
    check_prefill(ctx, ex, dex, s, make_inputs(70, topk, hidden, std::vector<int32_t>(70 * topk, 2), 19), {}, true);
    const std::vector<float> whole = run_moe(ctx, dex, s, in_one, 0, 200, cuda::MoePath::prefill);
    expect_batch_invariant(ctx, dex, s, in_one, whole);
  }
}

// V4-Flash expert shape (hidden 4096, intermediate 2048, top-6) with host
// experts: the CPU reference on sampled tokens, decode bits on all.
TEST(GpuNvfp4MoePrefill, FlashExpertShapeMatchesReference) {
  CM_SKIP_WITHOUT_GPU();
  cuda::Context ctx;
  const int64_t hidden = 4096, inter = 2048;
  const int count = 8, first = 16, topk = 6;
  Experts ex = make_experts(count, hidden, inter, 61);
  cuda::DeviceExperts dex = cuda::upload_experts(ptrs(ex.w1), ptrs(ex.w3), ptrs(ex.w2), first, 10.0f);
  cuda::MoeScratch s(dex, 512, topk);
  Rng r(62);
  for (int T : {64, 512}) {
    std::vector<int32_t> ids(size_t(T * topk));
    for (auto& id : ids) id = int32_t(first - 2 + int(r.next() % (count + 4)));
    check_prefill(ctx, ex, dex, s, make_inputs(T, topk, hidden, ids, 600 + uint64_t(T)), {0, 1, 33, T / 2, T - 2, T - 1});
  }
}

// The V4-Flash MoE layer (256 experts, top-6 distinct experts per token) on
// device-generated weights: prefill equals the decode kernels bit for bit at
// 64, 512 and 2048 tokens, with uniform routing and with one expert in every
// token's top-k (2048 tokens on it: 32 tiles); one step equals chunks of 7.
TEST(GpuNvfp4MoePrefill, FlashLayerMatchesDecodeBits) {
  CM_SKIP_WITHOUT_GPU();
  cuda::Context ctx;
  const int64_t hidden = 4096, inter = 2048;
  const int count = 256, topk = 6;
  cuda::DeviceExperts dex = cuda::random_experts(hidden, inter, 0, count, 71);
  cuda::MoeScratch s(dex, 2048, topk);
  const Experts none;
  Rng r(72);
  for (int T : {64, 512, 2048}) {
    for (bool skewed : {false, true}) {
      std::vector<int32_t> ids(size_t(T * topk));
      for (int t = 0; t < T; ++t)
        for (int k = 0; k < topk; ++k) {
          int32_t id;
          bool dup;
          do {  // distinct experts per token, as the router picks them
            id = (skewed && k == 0) ? 37 : int32_t(r.next() % count);
            dup = false;
            for (int j = 0; j < k; ++j) dup |= ids[size_t(t * topk + j)] == id;
          } while (dup);
          ids[size_t(t * topk + k)] = id;
        }
      const MoeInputs in = make_inputs(T, topk, hidden, ids, 700 + uint64_t(T) + skewed);
      check_prefill(ctx, none, dex, s, in);
      if (T == 512 && !skewed) expect_batch_invariant(ctx, dex, s, in, run_moe(ctx, dex, s, in, 0, T, cuda::MoePath::prefill));
    }
  }
}

}  // namespace
}  // namespace cm
