// GPU ops against their CPU ops on random inputs: embedding, RMSNorm (+RoPE),
// RoPE, mHC pre/post/head, the router, the dense linears, SwiGLU and the
// device tensor statistics. Shapes include
// V4-Flash's (hidden 4096, hc 4, 64 heads × 512, rope 64, 256 experts top-6).
// Metric: max|gpu − cpu| / max|cpu| (op_check.h); bounds:
//  - f32 outputs of the same fp32 math in another summation order: 1e-5
//    (norms over ≤ 4096 terms) or 1e-4 (mHC: dot products over 16384 terms,
//    then sigmoid and 39 Sinkhorn divisions);
//  - bf16 outputs: 8e-3 (bf16 keeps 8 significant bits: rounding to nearest
//    costs up to 2^-8 ≈ 3.9e-3 of a value just above a power of two, hence of
//    max|ref|; twice that as margin);
//  - discrete outputs (embedding bits, router ids): exact.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "common/error.h"
#include "op_check.h"
#include "ops/hc.h"
#include "ops/linear.h"
#include "ops/norm.h"
#include "ops/rope.h"
#include "seam/observer.h"
#include "ops/router.h"
#include "ops/stats.h"
#include "ops/swiglu.h"
#include "backend/cuda/linear/linear.h"
#include "backend/cuda/step/step_kernels.h"

namespace cm {
namespace {

using gputest::expect_err;
using gputest::make_rope;
using gputest::from_device;
using gputest::Guarded;
using gputest::max_rel;
using gputest::Rng;
using gputest::to_device;

std::string shape(std::initializer_list<std::pair<const char*, int64_t>> kv) {
  std::string s;
  for (auto& [k, v] : kv) s += std::string(s.empty() ? "" : " ") + k + "=" + std::to_string(v);
  return s;
}

TEST(GpuOps, EmbeddingRowsAreBitExact) {
  CM_SKIP_WITHOUT_GPU();
  cuda::Context ctx;
  Rng r(1);
  const int64_t rows = 1000, dim = 4096, hc = 4;
  for (WeightFormat f : {WeightFormat::F32, WeightFormat::BF16, WeightFormat::NVFP4}) {
    LinearWeight w;
    if (f == WeightFormat::NVFP4) {
      w = gputest::random_nvfp4(rows, dim, 7, 0.03f);
    } else {
      w.format = f;
      w.out_features = rows;
      w.in_features = dim;
      w.owned.resize(size_t(rows * dim) * (f == WeightFormat::F32 ? 4 : 2));
      for (size_t i = 0; i < w.owned.size(); ++i) w.owned[i] = uint8_t(r.next() >> 56);
      if (f == WeightFormat::F32)  // keep the values finite
        for (size_t i = 3; i < w.owned.size(); i += 4) w.owned[i] &= 0x3f;
      w.data = w.owned.data();
    }
    cuda::DeviceBuffer d = to_device(w.owned), s = to_device(w.owned_scale);
    DeviceWeightView v{f, d.get(), f == WeightFormat::NVFP4 ? s.get() : nullptr, w.scale_2, rows, dim};
    std::vector<int32_t> tok = {0, 999, 17, 17, 500, 3, 998, int32_t(rows)};  // the last one is out of range
    cuda::DeviceBuffer dt = to_device(tok);
    Guarded<float> x(tok.size() * hc * dim);
    embed_rows_cuda(ctx, v, dt.as<int32_t>(), int64_t(tok.size()), hc, x.ptr());
    ctx.sync();
    std::vector<float> got = x.get(), row(static_cast<size_t>(dim));
    int64_t mismatches = 0;
    for (size_t t = 0; t + 1 < tok.size(); ++t) {
      linear_expand_row(w, tok[t], row.data());
      for (int64_t k = 0; k < hc; ++k)
        for (int64_t j = 0; j < dim; ++j)
          mismatches += bits_from_f32(got[(t * hc + k) * dim + j]) != bits_from_f32(row[size_t(j)]);
    }
    EXPECT_EQ(mismatches, 0) << weight_format_name(f);
    for (int64_t j = 0; j < hc * dim; ++j) ASSERT_TRUE(std::isnan(got[(tok.size() - 1) * hc * dim + j]));
  }
}

TEST(GpuOps, RmsNormAndFusedRope) {
  CM_SKIP_WITHOUT_GPU();
  cuda::Context ctx;
  Rng r(2);
  struct Case {
    int64_t rows, dim, rope_dim, rows_per_pos;
    bool weighted, bf16_out, yarn;
  };
  const Case cases[] = {
      {7, 4096, 0, 1, true, true, false},     // attn_norm / ffn_norm -> bf16 for the next linear
      {5, 4096, 0, 1, true, false, false},    // final norm, f32
      {3, 1024, 0, 1, true, true, false},     // q_norm (q_lora 1024)
      {4 * 64, 512, 64, 64, false, true, true},  // per-head Q norm + RoPE, 64 heads × 512
      {9, 512, 64, 1, true, true, true},      // kv_norm + RoPE
      {6, 64, 8, 1, true, false, false},      // tiny fixture shape
  };
  const RopeTable t64 = make_rope(64, true), t8 = make_rope(8, false);
  for (const Case& c : cases) {
    std::vector<float> x = gputest::rand_f32(size_t(c.rows * c.dim), r, 3.0f, 0.5f);
    std::vector<float> w = gputest::rand_f32(size_t(c.dim), r, 0.5f, 1.0f);
    const int64_t npos = c.rows / c.rows_per_pos;
    std::vector<int32_t> pos(static_cast<size_t>(npos));
    for (int64_t i = 0; i < npos; ++i) pos[size_t(i)] = int32_t(i * 997 + 4096);  // contexts past 4K
    const RopeTable& tab = c.rope_dim == 64 ? t64 : t8;
    cuda::DeviceBuffer dx = to_device(x), dw = to_device(w), dp = to_device(pos), df = to_device(tab.freqs);
    RopeView rv{df.as<float>(), tab.rope_dim, 1.0f};
    const size_t n = size_t(c.rows * c.dim);
    Guarded<float> yf(n);
    Guarded<uint16_t> yb(n);
    rms_norm_cuda(ctx, dx.as<float>(), c.weighted ? dw.as<float>() : nullptr, c.rows, c.dim, 1e-6f,
                  c.bf16_out ? static_cast<void*>(yb.ptr()) : yf.ptr(), c.bf16_out, c.rope_dim ? &rv : nullptr,
                  dp.as<int32_t>(), c.rows_per_pos);
    ctx.sync();
    std::vector<float> ref(n);
    rms_norm_cpu(x.data(), c.weighted ? w.data() : nullptr, c.rows, c.dim, 1e-6f, ref.data());
    if (c.rope_dim)
      for (int64_t row = 0; row < c.rows; ++row)
        rope_apply_cpu(&ref[size_t(row * c.dim)], 1, c.dim, pos[size_t(row / c.rows_per_pos)], tab, false);
    const std::vector<float> got = c.bf16_out ? gputest::bf16_vals(yb.get()) : yf.get();
    expect_err(c.rope_dim ? "rms_norm+rope" : "rms_norm",
               shape({{"rows", c.rows}, {"dim", c.dim}, {"rope", c.rope_dim}, {"bf16", c.bf16_out}}),
               max_rel(got, ref), c.bf16_out ? 8e-3 : 1e-5);
  }
}

TEST(GpuOps, RopeForwardAndInverse) {
  CM_SKIP_WITHOUT_GPU();
  cuda::Context ctx;
  Rng r(3);
  struct Case {
    int64_t rows, dim, rope_dim, rows_per_pos;
    bool yarn, inverse, in_bf16, out_bf16;
  };
  const Case cases[] = {
      {8 * 64, 128, 64, 64, true, false, false, true},  // indexer q: 64 heads × 128, f32 -> bf16
      {3 * 64, 512, 64, 64, true, true, false, false},  // inverse on attention output
      {5, 512, 64, 1, false, false, true, true},        // bf16 in place
      {7, 32, 8, 1, false, true, false, false},
  };
  for (const Case& c : cases) {
    const RopeTable tab = make_rope(c.rope_dim, c.yarn);
    const size_t n = size_t(c.rows * c.dim);
    std::vector<float> xv;
    std::vector<uint16_t> xb = gputest::rand_bf16(n, r, 2.0f, &xv);
    const int64_t npos = c.rows / c.rows_per_pos;
    std::vector<int32_t> pos(static_cast<size_t>(npos));
    for (int64_t i = 0; i < npos; ++i) pos[size_t(i)] = int32_t((i * 131071) % 1000000);  // up to 1M
    cuda::DeviceBuffer dx = c.in_bf16 ? to_device(xb) : to_device(xv), dp = to_device(pos), df = to_device(tab.freqs);
    RopeView rv{df.as<float>(), tab.rope_dim, 1.0f};
    std::vector<float> got;
    if (c.in_bf16 && c.out_bf16) {  // in place
      rope_cuda(ctx, dx.get(), true, dx.get(), true, c.rows, c.dim, dp.as<int32_t>(), c.rows_per_pos, rv, c.inverse);
      ctx.sync();
      got = gputest::bf16_vals(from_device<uint16_t>(dx, n));
    } else if (c.out_bf16) {
      Guarded<uint16_t> y(n);
      rope_cuda(ctx, dx.get(), c.in_bf16, y.ptr(), true, c.rows, c.dim, dp.as<int32_t>(), c.rows_per_pos, rv,
                c.inverse);
      ctx.sync();
      got = gputest::bf16_vals(y.get());
    } else {
      Guarded<float> y(n);
      rope_cuda(ctx, dx.get(), c.in_bf16, y.ptr(), false, c.rows, c.dim, dp.as<int32_t>(), c.rows_per_pos, rv,
                c.inverse);
      ctx.sync();
      got = y.get();
    }
    std::vector<float> ref = xv;
    for (int64_t row = 0; row < c.rows; ++row)
      rope_apply_cpu(&ref[size_t(row * c.dim)], 1, c.dim, pos[size_t(row / c.rows_per_pos)], tab, c.inverse);
    expect_err(c.inverse ? "rope inverse" : "rope",
               shape({{"rows", c.rows}, {"dim", c.dim}, {"rope", c.rope_dim}, {"bf16_out", c.out_bf16}}),
               max_rel(got, ref), c.out_bf16 ? 8e-3 : 1e-5);
  }
}

TEST(GpuOps, HyperConnections) {
  CM_SKIP_WITHOUT_GPU();
  cuda::Context ctx;
  Rng r(4);
  for (auto [T, hc, D] : {std::tuple<int64_t, int64_t, int64_t>{5, 4, 4096}, {3, 4, 64}, {4, 2, 256}}) {
    const int64_t n = hc * D, R = (2 + hc) * hc;
    std::vector<float> x = gputest::rand_f32(size_t(T * n), r, 1.0f, 0.1f);
    std::vector<float> fn = gputest::rand_f32(size_t(R * n), r, 0.02f);
    std::vector<float> base = gputest::rand_f32(size_t(R), r, 0.5f), scale = {0.7f, 1.3f, 2.0f};
    std::vector<float> hfn = gputest::rand_f32(size_t(hc * n), r, 0.02f), hbase = gputest::rand_f32(size_t(hc), r, 0.5f);
    std::vector<float> hscale = {1.1f};
    cuda::DeviceBuffer dx = to_device(x), dfn = to_device(fn), db = to_device(base), ds = to_device(scale);
    cuda::DeviceBuffer dhfn = to_device(hfn), dhb = to_device(hbase), dhs = to_device(hscale);
    HcParams cp{fn.data(), base.data(), scale.data(), hc, D, 20, 1e-6f, 1e-6f};
    HcParams gp{dfn.as<float>(), db.as<float>(), ds.as<float>(), hc, D, 20, 1e-6f, 1e-6f};
    Guarded<float> a(size_t(T * D)), post(size_t(T * hc)), comb(size_t(T * hc * hc));
    Guarded<float> part(hc_mix_scratch_floats(hc, D, T));
    hc_pre_cuda(ctx, gp, dx.as<float>(), T, a.ptr(), post.ptr(), comb.ptr(), part.ptr());
    std::vector<float> ra(size_t(T * D)), rpost(size_t(T * hc)), rcomb(size_t(T * hc * hc));
    hc_pre_cpu(cp, x.data(), T, ra.data(), rpost.data(), rcomb.data());
    const std::string sh = shape({{"tokens", T}, {"hc", hc}, {"dim", D}});
    ctx.sync();
    expect_err("hc_pre collapsed", sh, max_rel(a.get(), ra), 1e-4);
    expect_err("hc_pre post", sh, max_rel(post.get(), rpost), 1e-4);
    expect_err("hc_pre comb (Sinkhorn)", sh, max_rel(comb.get(), rcomb), 1e-4);
    (void)part.get();  // the partial sums stay inside their scratch (canaries)
    // A token's result does not depend on the tokens sharing its step (the partial sums are per
    // token and chunk): the last token alone gives the same bits as inside the batch.
    {
      Guarded<float> a1{size_t(D)}, post1{size_t(hc)}, comb1{size_t(hc * hc)}, part1{hc_mix_scratch_floats(hc, D, 1)};
      hc_pre_cuda(ctx, gp, dx.as<float>() + (T - 1) * n, 1, a1.ptr(), post1.ptr(), comb1.ptr(), part1.ptr());
      ctx.sync();
      const std::vector<float> all = a.get(), one = a1.get(), callc = comb.get(), conec = comb1.get();
      EXPECT_EQ(std::memcmp(one.data(), all.data() + (T - 1) * D, size_t(D) * 4), 0) << "hc_pre collapsed, " << sh;
      EXPECT_EQ(std::memcmp(conec.data(), callc.data() + (T - 1) * hc * hc, size_t(hc * hc) * 4), 0)
          << "hc_pre comb, " << sh;
    }

    // hc_post on the CPU's post/comb (so only the post op is measured), in place.
    std::vector<float> out = gputest::rand_f32(size_t(T * D), r, 1.0f);
    cuda::DeviceBuffer dout = to_device(out), dpost = to_device(rpost), dcomb = to_device(rcomb);
    cuda::DeviceBuffer dx2 = to_device(x);
    hc_post_cuda(ctx, hc, D, dout.as<float>(), dpost.as<float>(), dcomb.as<float>(), T, dx2.as<float>());
    std::vector<float> rx = x;
    hc_post_cpu(hc, D, out.data(), rpost.data(), rcomb.data(), T, rx.data());
    ctx.sync();
    expect_err("hc_post", sh, max_rel(from_device<float>(dx2, rx.size()), rx), 1e-5);

    HcHeadParams hp{hfn.data(), hbase.data(), hscale.data(), hc, D, 1e-6f, 1e-6f};
    HcHeadParams ghp{dhfn.as<float>(), dhb.as<float>(), dhs.as<float>(), hc, D, 1e-6f, 1e-6f};
    Guarded<float> y(size_t(T * D)), hpart(hc_mix_scratch_floats(hc, D, T));
    hc_head_cuda(ctx, ghp, dx.as<float>(), T, y.ptr(), hpart.ptr());
    std::vector<float> ry(size_t(T * D));
    hc_head_cpu(hp, x.data(), T, ry.data());
    ctx.sync();
    expect_err("hc_head", sh, max_rel(y.get(), ry), 1e-4);
    (void)hpart.get();
  }
}

TEST(GpuOps, RouterScoreAndHashLayers) {
  CM_SKIP_WITHOUT_GPU();
  cuda::Context ctx;
  Rng r(5);
  for (auto [T, E, K] : {std::tuple<int64_t, int64_t, int64_t>{37, 256, 6}, {9, 384, 6}, {11, 8, 2}, {5, 16, 4}}) {
    std::vector<float> logits = gputest::rand_f32(size_t(T * E), r, 4.0f);
    for (int64_t e = 0; e < E; e += 7) logits[size_t(e)] = logits[1];  // exact ties in token 0
    for (int64_t e = 0; e < E; ++e) logits[size_t(E + e)] = 25.0f + float(e % 3);  // softplus threshold, ties
    // NaN logits in token 2 (the step reports them): the GPU router reads them as -inf, so the
    // reference gets -inf there; the highest logit of the row is one of them.
    std::vector<float> ref_logits = logits;
    int64_t top = 0;
    for (int64_t e = 1; e < E; ++e) top = logits[size_t(2 * E + e)] > logits[size_t(2 * E + top)] ? e : top;
    for (int64_t e : {top, int64_t(3), E - 1}) {
      logits[size_t(2 * E + e)] = NAN;
      ref_logits[size_t(2 * E + e)] = -INFINITY;
    }
    std::vector<float> bias = gputest::rand_f32(size_t(E), r, 0.1f);
    for (int64_t e = 0; e < E; ++e) bias[size_t(e)] = e % 5 == 0 ? 0.0f : bias[size_t(e)];
    const int64_t vocab = 50;
    std::vector<int32_t> tid2eid(size_t(vocab * K)), tok(static_cast<size_t>(T));
    for (auto& v : tid2eid) v = int32_t(r.next() % uint64_t(E));
    for (auto& v : tok) v = int32_t(r.next() % uint64_t(vocab));
    cuda::DeviceBuffer dl = to_device(logits), dbias = to_device(bias), dtid = to_device(tid2eid), dtok = to_device(tok);
    for (bool hash : {false, true}) {
      RouterParams cp{E, K, 1.5f, bias.data(), hash ? tid2eid.data() : nullptr, vocab};
      RouterParams gp{E, K, 1.5f, dbias.as<float>(), hash ? dtid.as<int32_t>() : nullptr, vocab};
      Guarded<int32_t> idx(size_t(T * K));
      Guarded<float> w(size_t(T * K));
      route_cuda(ctx, gp, dtok.as<int32_t>(), dl.as<float>(), T, idx.ptr(), w.ptr());
      std::vector<int32_t> ridx(size_t(T * K));
      std::vector<float> rw(size_t(T * K));
      route_cpu(cp, tok.data(), ref_logits.data(), T, ridx.data(), rw.data());
      ctx.sync();
      const std::string sh = shape({{"tokens", T}, {"experts", E}, {"topk", K}, {"hash", hash}});
      EXPECT_EQ(idx.get(), ridx) << "routing ids differ: " << sh;
      expect_err("router weights", sh, max_rel(w.get(), rw), 1e-5);
    }
  }
}

TEST(GpuOps, DenseLinearsThroughCublas) {
  CM_SKIP_WITHOUT_GPU();
  cuda::Context ctx;
  Rng r(6);
  // router 4096 -> 256, compressor 4096 -> 1024, indexer weights_proj 4096 -> 64, tiny 64 -> 16
  for (auto [M, N, K] : {std::tuple<int64_t, int64_t, int64_t>{7, 256, 4096}, {33, 1024, 4096}, {3, 64, 4096},
                         {5, 16, 64}}) {
    std::vector<float> wv;
    std::vector<uint16_t> wb = gputest::rand_bf16(size_t(N * K), r, 0.05f, &wv);
    std::vector<float> xv;
    std::vector<uint16_t> xb = gputest::rand_bf16(size_t(M * K), r, 1.0f, &xv);
    std::vector<float> ref(size_t(M * N));
    LinearWeight cw = linear_from_f32("test.dense", N, K, wv.data());
    linear_cpu(cw, xv.data(), M, ref.data());
    const std::string sh = shape({{"M", M}, {"N", N}, {"K", K}});
    {  // BF16 weight, bf16 x, f32 and bf16 y
      cuda::DeviceBuffer dw = to_device(wb), dx = to_device(xb);
      DeviceWeightView v{WeightFormat::BF16, dw.get(), nullptr, 1.0f, N, K};
      Guarded<float> y(size_t(M * N));
      Guarded<uint16_t> yb(size_t(M * N));
      linear_dense_cuda(ctx, v, dx.get(), true, M, K, y.ptr(), false, N);
      linear_dense_cuda(ctx, v, dx.get(), true, M, K, yb.ptr(), true, N);
      ctx.sync();
      expect_err("linear BF16 -> f32", sh, max_rel(y.get(), ref), 1e-4);
      expect_err("linear BF16 -> bf16", sh, max_rel(gputest::bf16_vals(yb.get()), ref), 8e-3);
    }
    {  // F32 weight, f32 x
      cuda::DeviceBuffer dw = to_device(wv), dx = to_device(xv);
      DeviceWeightView v{WeightFormat::F32, dw.get(), nullptr, 1.0f, N, K};
      Guarded<float> y(size_t(M * N));
      linear_dense_cuda(ctx, v, dx.get(), false, M, K, y.ptr(), false, N);
      ctx.sync();
      expect_err("linear F32 -> f32", sh, max_rel(y.get(), ref), 1e-4);
      EXPECT_THROW(linear_dense_cuda(ctx, v, dx.get(), true, M, K, y.ptr(), false, N), Error);
      // alpha scales the product (the indexer's 1/sqrt(heads))
      linear_dense_cuda(ctx, v, dx.get(), false, M, K, y.ptr(), false, N, 0.125f);
      std::vector<float> ref8 = ref;
      for (float& f : ref8) f *= 0.125f;
      ctx.sync();
      expect_err("linear F32 alpha=1/8", sh, max_rel(y.get(), ref8), 1e-4);
    }
  }
}

// The backend's dense linear (router, compressor, indexer projections, a BF16 head) against a double
// reference: BF16 weights on tensor cores with x split into three bf16 parts (f32 x) or one (bf16 x),
// F32 weights and odd K on the SIMT kernel; every tile shape (16/32 rows, 8/32 columns per CTA), a
// ragged last tile, grouped weights, N not a multiple of 8, K in 1 to 16 chunks. Batch invariance: the
// last row computed alone (the narrowest tiles, one CTA per chunk) equals the same row inside the
// batch (chunks in turn) bit for bit. Bound: 1e-5 of
// max|ref| (fp32 accumulation over K ≤ 4096 terms).
TEST(GpuOps, DenseKernelMatchesCpuAndIsBatchInvariant) {
  CM_SKIP_WITHOUT_GPU();
  cuda::Context ctx;
  Rng r(16);
  struct Case {
    int64_t M, N, K;
    int groups;
  };
  // router 4096 -> 256 (M 1, 40: 8 chunks of K, one CTA each at one row block, in turn for more), compressor
  // 4096 -> 1024 (M 17: 2 chunks), grouped 64 -> 16 (M 33), a wide head-like 1024 -> 8192 (M 40: 32-row x
  // 32-column tiles, one chunk), an indexer-like 4104 -> 64 (M 40: 16 chunks, the last one short), N = 20
  // (ragged column tile), K = 36 (SIMT for BF16).
  const std::vector<Case> cases = {{1, 256, 4096, 1}, {40, 256, 4096, 1}, {17, 1024, 4096, 1}, {33, 16, 64, 2},
                                   {40, 8192, 1024, 1}, {40, 64, 4104, 1}, {5, 20, 64, 1},     {7, 24, 36, 1}};
  for (const Case& c : cases)
    for (int variant = 0; variant < 3; ++variant) {  // 0: BF16 W, f32 x; 1: BF16 W, bf16 x; 2: F32 W, f32 x
      const int64_t M = c.M, N = c.N, K = c.K, groups = c.groups, ldx = groups * K;
      const bool wbf = variant < 2, xbf = variant == 1;
      std::vector<float> wv;
      std::vector<uint16_t> wb = gputest::rand_bf16(size_t(N * K), r, 0.05f, &wv);
      std::vector<float> x = gputest::rand_f32(size_t(M * ldx), r, 1.0f);
      std::vector<uint16_t> xb(x.size());
      for (size_t i = 0; i < x.size(); ++i) {
        xb[i] = f32_to_bf16(x[i]);
        if (xbf) x[i] = bf16_to_f32(xb[i]);
      }
      std::vector<float> ref(size_t(M * N));
      const int64_t rpg = N / groups;
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < N; ++n) {
          double acc = 0;
          const int64_t g = n / rpg;
          for (int64_t k = 0; k < K; ++k) acc += double(x[size_t(m * ldx + g * K + k)]) * double(wv[size_t(n * K + k)]);
          ref[size_t(m * N + n)] = float(acc);
        }
      const std::string sh = shape({{"M", M}, {"N", N}, {"K", K}, {"groups", groups}, {"variant", variant}});
      cuda::DeviceBuffer dw = wbf ? to_device(wb) : to_device(wv), dx = xbf ? to_device(xb) : to_device(x);
      Guarded<float> y{size_t(M * N)}, y1{size_t(N)};
      const size_t es = xbf ? 2 : 4;
      cuda::dense_linear(ctx, dw.get(), wbf, N, K, int(groups), dx.get(), xbf, M, ldx, y.ptr(), false, N, 1.0f);
      const int64_t last = M - 1;
      cuda::dense_linear(ctx, dw.get(), wbf, N, K, int(groups), static_cast<const char*>(dx.get()) + last * ldx * es,
                         xbf, 1, ldx, y1.ptr(), false, N, 1.0f);
      ctx.sync();
      const std::vector<float> all = y.get(), one = y1.get();
      expect_err("dense linear", sh, max_rel(all, ref), 1e-5);
      EXPECT_EQ(std::memcmp(one.data(), all.data() + last * N, size_t(N) * 4), 0) << "row " << last << " alone, " << sh;
    }
}

// The step's non-finite counter: several intermediates in one launch, f32 and bf16, 16-byte-aligned
// rows (vector path) and rows that are not (scalar path), NaN, +Inf and -Inf at random places.
TEST(GpuOps, NonFiniteCountsInOneLaunch) {
  CM_SKIP_WITHOUT_GPU();
  cuda::Context ctx;
  Rng r(21);
  const int64_t rows = 5;
  struct Case {
    int64_t width;
    bool bf16;
    int64_t offset;  // elements: 1 makes the rows unaligned
  };
  // kMax (16, a layer's intermediates) of them in one launch.
  const std::vector<Case> cases = {{32768, true, 0}, {4096, false, 0}, {512, false, 1}, {64, true, 1},
                                   {37, true, 0},    {16384, false, 0}, {1000, false, 0}, {999, true, 1},
                                   {4096, true, 0},  {512, true, 0},   {128, false, 1},  {33, false, 0},
                                   {8192, true, 1},  {2048, false, 0}, {16, true, 0},    {7, false, 1}};
  ASSERT_EQ(cases.size(), size_t(cuda::NonFiniteBatch::kMax));
  cuda::NonFiniteBatch b;
  std::vector<cuda::DeviceBuffer> bufs;
  std::vector<std::vector<int32_t>> want;
  std::vector<Guarded<int32_t>> outs;
  outs.reserve(cases.size());
  const float bad_vals[3] = {NAN, INFINITY, -INFINITY};
  for (const Case& c : cases) {
    const size_t n = size_t(rows * c.width + c.offset);
    std::vector<float> v = gputest::rand_f32(n, r, 1.0f);
    std::vector<int32_t> cnt(size_t(rows), 0);
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t k = int64_t(r.uniform() * 6.0f);  // 0..5 bad values in this row
      for (int64_t j = 0; j < k; ++j) {
        const size_t at = size_t(c.offset + i * c.width + int64_t(r.uniform() * float(c.width - 1)));
        if (std::isfinite(v[at])) ++cnt[size_t(i)];
        v[at] = bad_vals[j % 3];
      }
    }
    if (c.bf16) {
      std::vector<uint16_t> h(n);
      for (size_t i = 0; i < n; ++i) h[i] = f32_to_bf16(v[i]);
      bufs.push_back(to_device(h));
    } else {
      bufs.push_back(to_device(v));
    }
    outs.emplace_back(size_t(rows));
    want.push_back(cnt);
    const int i = b.count++;
    b.x[i] = static_cast<const char*>(bufs.back().get()) + c.offset * (c.bf16 ? 2 : 4);
    b.width[i] = c.width;
    b.bf16[i] = c.bf16;
    b.out[i] = outs.back().ptr();
  }
  cuda::count_non_finite(ctx, b, rows);
  ctx.sync();
  for (size_t i = 0; i < cases.size(); ++i)
    EXPECT_EQ(outs[i].get(), want[i]) << "width " << cases[i].width << (cases[i].bf16 ? " bf16" : " f32") << " offset "
                                      << cases[i].offset;
  cuda::NonFiniteBatch too_many;
  too_many.count = cuda::NonFiniteBatch::kMax + 1;
  EXPECT_THROW(cuda::count_non_finite(ctx, too_many, rows), Error);
}

TEST(GpuOps, SwigluWithClampAndRowWeight) {
  CM_SKIP_WITHOUT_GPU();
  cuda::Context ctx;
  Rng r(7);
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{7, 2048}, {3, 256}, {33, 64}}) {
    // gate and up as the two halves of one fused output row, values past the limit 10
    std::vector<float> gu = gputest::rand_f32(size_t(rows * 2 * cols), r, 15.0f);
    std::vector<float> wt = gputest::rand_f32(size_t(rows), r, 0.5f, 1.0f);
    cuda::DeviceBuffer dgu = to_device(gu), dwt = to_device(wt);
    std::vector<float> ref(size_t(rows * cols));
    for (int64_t row = 0; row < rows; ++row) {
      swiglu_cpu(&gu[size_t(row * 2 * cols)], &gu[size_t(row * 2 * cols + cols)], cols, 10.0f, &ref[size_t(row * cols)]);
      for (int64_t c = 0; c < cols; ++c) ref[size_t(row * cols + c)] *= wt[size_t(row)];
    }
    Guarded<float> hf(size_t(rows * cols));
    Guarded<uint16_t> hb(size_t(rows * cols));
    const float* g = dgu.as<float>();
    swiglu_cuda(ctx, g, g + cols, 2 * cols, rows, cols, 10.0f, dwt.as<float>(), hf.ptr(), false);
    swiglu_cuda(ctx, g, g + cols, 2 * cols, rows, cols, 10.0f, dwt.as<float>(), hb.ptr(), true);
    ctx.sync();
    const std::string sh = shape({{"rows", rows}, {"cols", cols}});
    expect_err("swiglu -> f32", sh, max_rel(hf.get(), ref), 1e-5);
    expect_err("swiglu -> bf16", sh, max_rel(gputest::bf16_vals(hb.get()), ref), 8e-3);
  }
}

TEST(GpuOps, TensorStatsMatchTheCpuObserver) {
  CM_SKIP_WITHOUT_GPU();
  cuda::Context ctx;
  Rng r(8);
  const int64_t T = 37, hc = 4, D = 4096;
  std::vector<float> x = gputest::rand_f32(size_t(T * hc * D), r, 3.0f, 0.2f);
  x[5] = NAN;
  x[size_t(2 * D + 7)] = INFINITY;
  x[size_t((3 * hc + 1) * D + 9)] = -INFINITY;
  x[size_t((9 * hc + 1) * D)] = -1000.0f;  // the amax of stream 1
  cuda::DeviceBuffer dx = to_device(x), out(sizeof(DeviceTensorStats) * (hc + 1)), out2(sizeof(DeviceTensorStats) * (hc + 1));
  auto* o = out.as<DeviceTensorStats>();
  auto* o2 = out2.as<DeviceTensorStats>();
  tensor_stats_cuda(ctx, dx.as<float>(), 1, T * hc * D, T * hc * D, o);
  tensor_stats_cuda(ctx, dx.as<float>(), 1, T * hc * D, T * hc * D, o2);
  for (int64_t k = 0; k < hc; ++k) {
    tensor_stats_cuda(ctx, dx.as<float>() + k * D, T, D, hc * D, o + 1 + k);
    tensor_stats_cuda(ctx, dx.as<float>() + k * D, T, D, hc * D, o2 + 1 + k);
  }
  ctx.sync();
  std::vector<DeviceTensorStats> got(size_t(hc + 1)), again(size_t(hc + 1));
  out.download(got.data(), out.size());
  out2.download(again.data(), out2.size());
  EXPECT_EQ(0, std::memcmp(got.data(), again.data(), out.size())) << "stats differ between runs";
  for (int64_t k = -1; k < hc; ++k) {
    TensorStats ref;
    if (k < 0) {
      ref = tensor_stats(x.data(), T * hc * D);
    } else {  // stream k over all tokens, as LayerStatsObserver combines them
      double sum = 0;
      for (int64_t t = 0; t < T; ++t) {
        TensorStats s = tensor_stats(&x[size_t((t * hc + k) * D)], D);
        ref.amax = std::max(ref.amax, s.amax);
        sum += s.mean * double(s.count);
        ref.count += s.count;
        ref.nan += s.nan;
        ref.inf += s.inf;
      }
      ref.mean = sum / double(ref.count);
    }
    const DeviceTensorStats& g = got[size_t(k + 1)];
    EXPECT_EQ(g.amax, ref.amax) << "segment " << k;
    EXPECT_EQ(g.nan, ref.nan) << "segment " << k;
    EXPECT_EQ(g.inf, ref.inf) << "segment " << k;
    EXPECT_EQ(g.count, ref.count) << "segment " << k;
    EXPECT_NEAR(g.sum / double(g.count), ref.mean, 1e-9 * std::max(1.0, std::fabs(ref.mean))) << "segment " << k;
  }
}

}  // namespace
}  // namespace cm
