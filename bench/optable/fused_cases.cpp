// The fused kernels (op table, check-only cases: fused_*) of the GPU step (fewer launches per layer at decode) against
// the unfused kernels they replace and against the CPU ops:
//  - RMSNorm + its bf16 copy (rms_norm_cuda's y_copy_bf16) = rms_norm_cuda, then
//    cast_f32_bf16: bit for bit; two norm calls in one launch (rms_norm2_cuda, the
//    Q and KV norms + RoPE) = the two calls, bit for bit;
//  - hc_post fused with the next hc_pre's partial sums (hc_post_mix_cuda), then
//    the finishing kernel = hc_post_cuda, then hc_pre_cuda: bit for bit (streams,
//    partial sums, collapsed, post, comb);
//  - hc_pre's (and hc_head's) finishing kernel fused with the RMSNorm
//    (hc_pre_norm_cuda, hc_head_norm_cuda) = hc_pre_cuda (hc_head_cuda), then
//    rms_norm_cuda and the cast: bit for bit as well (the fused norm reduces with
//    the RMSNorm kernel's thread count and order, norm_device.cuh), and a token's
//    bits do not depend on the other tokens of the step.
// Shapes: V4-Flash's (hidden 4096, hc 4) at 1, 3, 17 and 256 tokens, the tiny
// fixture's (hidden 256), and odd ones (a hidden size whose hc·D is no multiple
// of the 512-element chunks, dims below a warp). Every output is Guarded (canary
// zones; NaN-filled, so a missed element fails). CPU bounds (max|gpu − cpu| /
// max|cpu|, op_util.h): 1e-5 for the f32 norm and hc_post (the same math, other
// summation order), 1e-4 for hc_pre/hc_head (+ norm) outputs (dot products over
// up to 16384 terms, sigmoid, Sinkhorn), 8e-3 for bf16 copies.
#include <cstring>
#include <string>
#include <vector>

#include "backend/cuda/step/step_kernels.h"
#include "bench/optable/op_case.h"
#include "bench/optable/op_util.h"
#include "common/error.h"
#include "ops/hc.h"
#include "ops/norm.h"
#include "ops/rope.h"

namespace cm::optable {
namespace {

std::string shape(int64_t tokens, int64_t hc, int64_t dim) {
  return "tokens=" + std::to_string(tokens) + " hc=" + std::to_string(hc) + " dim=" + std::to_string(dim);
}

void NormWithBf16CopyGivesTheCastBits(cuda::Context& ctx, Checker& k) {
    Rng r(11);
  struct Case {
    int64_t rows, dim, rope_dim;
    bool weighted, in_place;
  };
  const Case cases[] = {
      {1, 4096, 0, true, false},   {3, 4096, 0, true, false},  {17, 4096, 0, true, false},
      {256, 4096, 0, true, false}, {1, 1024, 0, true, true},   {17, 1024, 0, true, true},  // q_norm on qr, in place
      {5, 512, 64, true, false},   {7, 1000, 0, false, false}, {4, 77, 0, true, true},     {9, 24, 8, true, false},
  };
  const RopeTable t64 = make_rope(64, true), t8 = make_rope(8, false);
  for (const Case& c : cases) {
    const size_t n = size_t(c.rows * c.dim);
    std::vector<float> x = rand_f32(n, r, 3.0f, 0.5f), w = rand_f32(size_t(c.dim), r, 0.5f, 1.0f);
    std::vector<int32_t> pos(size_t(c.rows));
    for (int64_t i = 0; i < c.rows; ++i) pos[size_t(i)] = int32_t(i * 613 + 5);
    const RopeTable& tab = c.rope_dim == 64 ? t64 : t8;
    cuda::DeviceBuffer dw = to_device(w), dp = to_device(pos), df = to_device(tab.freqs);
    const RopeView rv{df.as<float>(), tab.rope_dim, 1.0f};
    const RopeView* rope = c.rope_dim ? &rv : nullptr;
    const float* wp = c.weighted ? dw.as<float>() : nullptr;
    const std::string sh = "rows=" + std::to_string(c.rows) + " dim=" + std::to_string(c.dim) +
                           " rope=" + std::to_string(c.rope_dim) + (c.in_place ? " in place" : "");
    // Unfused: the norm, then the cast run_linear makes.
    cuda::DeviceBuffer dx_ref = to_device(x), ref_bf(n * 2);
    Guarded<float> ref_y(n);
    float* ry = c.in_place ? dx_ref.as<float>() : ref_y.ptr();
    rms_norm_cuda(ctx, dx_ref.as<float>(), wp, c.rows, c.dim, 1e-6f, ry, false, rope, dp.as<int32_t>(), 1);
    cuda::cast_f32_bf16(ctx, ry, c.dim, c.rows, c.dim, ref_bf.as<uint16_t>(), c.dim);
    // Fused: the norm writes both.
    cuda::DeviceBuffer dx = to_device(x);
    Guarded<float> y(n);
    Guarded<uint16_t> yb(n);
    float* fy = c.in_place ? dx.as<float>() : y.ptr();
    rms_norm_cuda(ctx, dx.as<float>(), wp, c.rows, c.dim, 1e-6f, fy, false, rope, dp.as<int32_t>(), 1, yb.ptr());
    ctx.sync();
    const std::vector<float> want = c.in_place ? from_device<float>(dx_ref, n) : ref_y.get(k);
    const std::vector<float> got = c.in_place ? from_device<float>(dx, n) : y.get(k);
    const std::vector<uint16_t> want_bf = from_device<uint16_t>(ref_bf, n), got_bf = yb.get(k);
    same(k, got, want, "rms_norm f32, " + sh);
    same(k, got_bf, want_bf, "rms_norm bf16 copy vs cast_f32_bf16, " + sh);
    std::vector<float> cpu(n);
    rms_norm_cpu(x.data(), wp ? w.data() : nullptr, c.rows, c.dim, 1e-6f, cpu.data());
    if (rope)
      for (int64_t row = 0; row < c.rows; ++row)
        rope_apply_cpu(&cpu[size_t(row * c.dim)], 1, c.dim, pos[size_t(row)], tab, false);
    err(k, "rms_norm (+copy) f32", sh, max_rel(got, cpu), 1e-5);
    err(k, "rms_norm (+copy) bf16 copy", sh, max_rel(bf16_vals(got_bf), cpu), 8e-3);
  }
  // A bf16 output has no bf16 copy; the copy overwrites neither input nor output.
  cuda::DeviceBuffer a(4096 * 4), b(4096 * 2);
  throws(k, [&] { rms_norm_cuda(ctx, a.as<float>(), nullptr, 1, 4096, 1e-6f, b.get(), true, nullptr, nullptr, 1,
                             b.as<uint16_t>()); }, "refusal");
  throws(k, [&] { rms_norm_cuda(ctx, a.as<float>(), nullptr, 1, 1024, 1e-6f, a.get(), false, nullptr, nullptr, 1,
                             a.as<uint16_t>()); }, "refusal");
}

// The per-head Q norm + RoPE and the KV norm + RoPE in one launch (rms_norm2_cuda) = the two calls.
void TwoNormsInOneLaunchGiveTheirOwnBits(cuda::Context& ctx, Checker& k) {
    Rng r(14);
  struct Case {
    int64_t T, H, hd, rope_dim;
  };
  const Case cases[] = {{1, 64, 512, 64}, {3, 64, 512, 64}, {17, 64, 512, 64}, {256, 64, 512, 64}, {5, 3, 24, 8}};
  const RopeTable t64 = make_rope(64, true), t8 = make_rope(8, false);
  for (const Case& c : cases) {
    const RopeTable& tab = c.rope_dim == 64 ? t64 : t8;
    const size_t nq = size_t(c.T * c.H * c.hd), nk = size_t(c.T * c.hd);
    const std::vector<float> q = rand_f32(nq, r, 3.0f, 0.2f), kv = rand_f32(nk, r, 2.0f, -0.1f);
    const std::vector<float> w = rand_f32(size_t(c.hd), r, 0.5f, 1.0f);
    std::vector<int32_t> pos(size_t(c.T));
    for (int64_t i = 0; i < c.T; ++i) pos[size_t(i)] = int32_t(i * 389 + 70000);  // past YaRN's original window
    cuda::DeviceBuffer dq = to_device(q), dk = to_device(kv), dw = to_device(w), dp = to_device(pos),
                       df = to_device(tab.freqs);
    const RopeView rv{df.as<float>(), tab.rope_dim, 1.0f};
    const std::string sh = "tokens=" + std::to_string(c.T) + " heads=" + std::to_string(c.H) + " hd=" +
                           std::to_string(c.hd);
    cuda::DeviceBuffer rq(nq * 2), rk(nk * 2);
    rms_norm_cuda(ctx, dq.as<float>(), nullptr, c.T * c.H, c.hd, 1e-6f, rq.get(), true, &rv, dp.as<int32_t>(), c.H);
    rms_norm_cuda(ctx, dk.as<float>(), dw.as<float>(), c.T, c.hd, 1e-6f, rk.get(), true, &rv, dp.as<int32_t>(), 1);
    Guarded<uint16_t> gq(nq), gk(nk);
    rms_norm2_cuda(ctx, RmsNormJob{dq.as<float>(), nullptr, c.T * c.H, c.hd, 1e-6f, gq.ptr(), true, &rv,
                                   dp.as<int32_t>(), c.H},
                   RmsNormJob{dk.as<float>(), dw.as<float>(), c.T, c.hd, 1e-6f, gk.ptr(), true, &rv, dp.as<int32_t>(), 1});
    ctx.sync();
    const std::vector<uint16_t> got_q = gq.get(k), got_k = gk.get(k);
    same(k, got_q, from_device<uint16_t>(rq, nq), "q norm+rope, " + sh);
    same(k, got_k, from_device<uint16_t>(rk, nk), "kv norm+rope, " + sh);
    std::vector<float> cq(nq), ck(nk);
    rms_norm_cpu(q.data(), nullptr, c.T * c.H, c.hd, 1e-6f, cq.data());
    rms_norm_cpu(kv.data(), w.data(), c.T, c.hd, 1e-6f, ck.data());
    for (int64_t t = 0; t < c.T; ++t) {
      for (int64_t h = 0; h < c.H; ++h) rope_apply_cpu(&cq[size_t((t * c.H + h) * c.hd)], 1, c.hd, pos[size_t(t)], tab, false);
      rope_apply_cpu(&ck[size_t(t * c.hd)], 1, c.hd, pos[size_t(t)], tab, false);
    }
    err(k, "rms_norm2 q (bf16)", sh, max_rel(bf16_vals(got_q), cq), 8e-3);
    err(k, "rms_norm2 kv (bf16)", sh, max_rel(bf16_vals(got_k), ck), 8e-3);
  }
  cuda::DeviceBuffer a(512 * 4), b(256 * 4), y(512 * 4);
  throws(k, [&] { rms_norm2_cuda(ctx, RmsNormJob{a.as<float>(), nullptr, 1, 512, 1e-6f, y.get()},
                              RmsNormJob{b.as<float>(), nullptr, 1, 256, 1e-6f, y.get()}); }, "refusal");
}

// Random mHC parameters of one hc_pre (fn, base, scale) on the host and the device.
struct HcSet {
  std::vector<float> fn, base, scale;
  cuda::DeviceBuffer dfn, dbase, dscale;
  HcSet(Rng& r, int64_t hc, int64_t D, bool head) {
    const int64_t R = head ? hc : (2 + hc) * hc;
    fn = rand_f32(size_t(R * hc * D), r, 0.02f);
    base = rand_f32(size_t(R), r, 0.5f);
    scale = head ? std::vector<float>{1.1f} : std::vector<float>{0.7f, 1.3f, 2.0f};
    dfn = to_device(fn), dbase = to_device(base), dscale = to_device(scale);
  }
  HcParams cpu(int64_t hc, int64_t D) const { return HcParams{fn.data(), base.data(), scale.data(), hc, D, 20, 1e-6f, 1e-6f}; }
  HcParams gpu(int64_t hc, int64_t D) const {
    return HcParams{dfn.as<float>(), dbase.as<float>(), dscale.as<float>(), hc, D, 20, 1e-6f, 1e-6f};
  }
};

struct HcShape {
  int64_t T, hc, D;
};
// V4-Flash decode and prefill tile shapes, the tiny fixture's, odd ones (4·1000 = 7.8 chunks of 512;
// hidden sizes below and just above a warp; hc 1..3).
const HcShape kHcShapes[] = {{1, 4, 4096}, {3, 4, 4096}, {17, 4, 4096}, {256, 4, 4096}, {1, 4, 256}, {5, 4, 256},
                             {3, 4, 1000}, {2, 3, 77},   {4, 2, 130},   {1, 1, 33},     {6, 4, 24}};

void HcPostWithNextPrePartialsGivesTheUnfusedBits(cuda::Context& ctx, Checker& k) {
    Rng r(12);
  for (const HcShape& s : kHcShapes) {
    const int64_t T = s.T, hc = s.hc, D = s.D, n = hc * D;
    const std::string sh = shape(T, hc, D);
    std::vector<float> x = rand_f32(size_t(T * n), r, 1.0f, 0.1f), out = rand_f32(size_t(T * D), r, 1.0f);
    std::vector<float> post = rand_f32(size_t(T * hc), r, 0.9f, 1.0f);
    std::vector<float> comb = rand_f32(size_t(T * hc * hc), r, 0.25f, 0.25f);
    const HcSet next(r, hc, D, false);
    cuda::DeviceBuffer dout = to_device(out), dpost = to_device(post), dcomb = to_device(comb);
    const HcParams gp = next.gpu(hc, D);
    const size_t nscr = hc_mix_scratch_floats(hc, D, T);

    // Unfused: hc_post in place, then hc_pre over the new streams.
    cuda::DeviceBuffer ref_x = to_device(x);
    Guarded<float> ref_a(size_t(T * D)), ref_post(size_t(T * hc)), ref_comb(size_t(T * hc * hc)), ref_part(nscr);
    hc_post_cuda(ctx, hc, D, dout.as<float>(), dpost.as<float>(), dcomb.as<float>(), T, ref_x.as<float>());
    hc_pre_cuda(ctx, gp, ref_x.as<float>(), T, ref_a.ptr(), ref_post.ptr(), ref_comb.ptr(), ref_part.ptr());

    // Fused: post out of place with the partial sums, then only the finishing kernel (with the norm).
    cuda::DeviceBuffer dx = to_device(x);
    Guarded<float> x_out(size_t(T * n)), part(nscr), a(size_t(T * D)), post2(size_t(T * hc)), comb2(size_t(T * hc * hc));
    Guarded<float> normed(size_t(T * D));
    hc_post_mix_cuda(ctx, hc, D, dout.as<float>(), dpost.as<float>(), dcomb.as<float>(), T, dx.as<float>(), x_out.ptr(),
                     &gp, part.ptr());
    ctx.sync();
    const std::vector<float> part_got = part.get(k);  // before the finishing kernel reads it (and after: unchanged)
    hc_pre_norm_cuda(ctx, gp, x_out.ptr(), T, a.ptr(), post2.ptr(), comb2.ptr(), part.ptr(),
                     HcNormOut{nullptr, 1e-6f, normed.ptr(), nullptr}, true);
    ctx.sync();
    const std::vector<float> new_x = x_out.get(k), want_x = from_device<float>(ref_x, size_t(T * n));
    same(k, new_x, want_x, "hc_post streams, " + sh);
    same(k, part_got, ref_part.get(k), "hc_pre partial sums, " + sh);
    same(k, part.get(k), part_got, "partial sums after the finishing kernel, " + sh);
    same(k, a.get(k), ref_a.get(k), "hc_pre collapsed, " + sh);
    same(k, post2.get(k), ref_post.get(k), "hc_pre post, " + sh);
    same(k, comb2.get(k), ref_comb.get(k), "hc_pre comb, " + sh);
    same(k, from_device<float>(dx, size_t(T * n)), x, "the fused post's input streams (unchanged), " + sh);

    // The post alone out of place (the last layer's) = in place.
    Guarded<float> x_last(size_t(T * n));
    hc_post_mix_cuda(ctx, hc, D, dout.as<float>(), dpost.as<float>(), dcomb.as<float>(), T, dx.as<float>(),
                     x_last.ptr(), nullptr, nullptr);
    ctx.sync();
    same(k, x_last.get(k), want_x, "hc_post out of place, " + sh);

    // The CPU ops.
    std::vector<float> cx = x;
    hc_post_cpu(hc, D, out.data(), post.data(), comb.data(), T, cx.data());
    err(k, "hc_post (fused)", sh, max_rel(new_x, cx), 1e-5);
    std::vector<float> ca(size_t(T * D)), cpost(size_t(T * hc)), ccomb(size_t(T * hc * hc));
    hc_pre_cpu(next.cpu(hc, D), cx.data(), T, ca.data(), cpost.data(), ccomb.data());
    err(k, "hc_pre after fused post", sh, max_rel(a.get(k), ca), 1e-4);
    err(k, "hc_pre post after fused post", sh, max_rel(post2.get(k), cpost), 1e-4);
    err(k, "hc_pre comb after fused post", sh, max_rel(comb2.get(k), ccomb), 1e-4);
  }
  // The fused post cannot write its input; the next hc_pre must have the post's shape.
  cuda::Context& c2 = ctx;
  cuda::DeviceBuffer b(4 * 4096 * 4), o(4096 * 4), p(16), cm(64), part(hc_mix_scratch_floats(4, 4096, 1) * 4);
  Rng r2(1);
  const HcSet next(r2, 4, 4096, false), other(r2, 4, 256, false);
  const HcParams gp = next.gpu(4, 4096), bad = other.gpu(4, 256);
  throws(k, [&] { hc_post_mix_cuda(c2, 4, 4096, o.as<float>(), p.as<float>(), cm.as<float>(), 1, b.as<float>(),
                                b.as<float>(), &gp, part.as<float>()); }, "refusal");
  cuda::DeviceBuffer b2(4 * 4096 * 4);
  throws(k, [&] { hc_post_mix_cuda(c2, 4, 4096, o.as<float>(), p.as<float>(), cm.as<float>(), 1, b.as<float>(),
                                b2.as<float>(), &bad, part.as<float>()); }, "refusal");
}

void HcFinishWithNormGivesTheUnfusedBits(cuda::Context& ctx, Checker& k) {
    Rng r(13);
  for (const HcShape& s : kHcShapes) {
    const int64_t T = s.T, hc = s.hc, D = s.D, n = hc * D;
    const std::string sh = shape(T, hc, D);
    const std::vector<float> x = rand_f32(size_t(T * n), r, 1.0f, 0.1f);
    const std::vector<float> w = rand_f32(size_t(D), r, 0.5f, 1.0f);
    const HcSet pre(r, hc, D, false), head(r, hc, D, true);
    cuda::DeviceBuffer dx = to_device(x), dw = to_device(w);
    const size_t nscr = hc_mix_scratch_floats(hc, D, T);
    for (bool weighted : {true, false}) {
      const float* wp = weighted ? dw.as<float>() : nullptr;
      const std::string shw = sh + (weighted ? "" : " unweighted");
      // Unfused: hc_pre, then the norm and the cast of its output.
      Guarded<float> a(size_t(T * D)), post(size_t(T * hc)), comb(size_t(T * hc * hc)), part(nscr), y(size_t(T * D));
      cuda::DeviceBuffer yb(size_t(T * D) * 2);
      hc_pre_cuda(ctx, pre.gpu(hc, D), dx.as<float>(), T, a.ptr(), post.ptr(), comb.ptr(), part.ptr());
      rms_norm_cuda(ctx, a.ptr(), wp, T, D, 1e-6f, y.ptr(), false);
      cuda::cast_f32_bf16(ctx, y.ptr(), D, T, D, yb.as<uint16_t>(), D);
      // Fused, without the collapsed rows.
      Guarded<float> post2(size_t(T * hc)), comb2(size_t(T * hc * hc)), part2(nscr), y2(size_t(T * D));
      Guarded<uint16_t> yb2(size_t(T * D));
      hc_pre_norm_cuda(ctx, pre.gpu(hc, D), dx.as<float>(), T, nullptr, post2.ptr(), comb2.ptr(), part2.ptr(),
                       HcNormOut{wp, 1e-6f, y2.ptr(), yb2.ptr()});
      ctx.sync();
      const std::vector<float> got = y2.get(k);
      const std::vector<uint16_t> got_bf = yb2.get(k);
      same(k, got, y.get(k), "hc_pre+rms_norm normed, " + shw);
      same(k, got_bf, from_device<uint16_t>(yb, size_t(T * D)), "hc_pre+rms_norm bf16 copy, " + shw);
      same(k, post2.get(k), post.get(k), "hc_pre+rms_norm post, " + shw);
      same(k, comb2.get(k), comb.get(k), "hc_pre+rms_norm comb, " + shw);
      (void)part2.get(k);  // canaries
      // CPU: hc_pre then rms_norm.
      std::vector<float> ca(size_t(T * D)), cp(size_t(T * hc)), cc(size_t(T * hc * hc)), cy(size_t(T * D));
      hc_pre_cpu(pre.cpu(hc, D), x.data(), T, ca.data(), cp.data(), cc.data());
      rms_norm_cpu(ca.data(), weighted ? w.data() : nullptr, T, D, 1e-6f, cy.data());
      err(k, "hc_pre+rms_norm", shw, max_rel(got, cy), 1e-4);
      err(k, "hc_pre+rms_norm bf16 copy", shw, max_rel(bf16_vals(got_bf), cy), 8e-3);
      // Batch invariance: the last token alone gives the bits it has inside the step.
      {
        Guarded<float> p1{size_t(hc)}, c1{size_t(hc * hc)}, s1{hc_mix_scratch_floats(hc, D, 1)}, y1{size_t(D)};
        hc_pre_norm_cuda(ctx, pre.gpu(hc, D), dx.as<float>() + (T - 1) * n, 1, nullptr, p1.ptr(), c1.ptr(), s1.ptr(),
                         HcNormOut{wp, 1e-6f, y1.ptr(), nullptr});
        ctx.sync();
        const std::vector<float> one = y1.get(k), last(got.end() - D, got.end());
        same(k, one, last, "hc_pre+rms_norm of the last token alone, " + shw);
      }

      // hc_head, then the final norm (in place, as the step did), against the fused head.
      Guarded<float> hy(size_t(T * D)), hpart(nscr), hy2(size_t(T * D)), hpart2(nscr);
      Guarded<uint16_t> hyb(size_t(T * D));
      const HcHeadParams hp{head.dfn.as<float>(), head.dbase.as<float>(), head.dscale.as<float>(), hc, D, 1e-6f, 1e-6f};
      hc_head_cuda(ctx, hp, dx.as<float>(), T, hy.ptr(), hpart.ptr());
      rms_norm_cuda(ctx, hy.ptr(), wp, T, D, 1e-6f, hy.ptr(), false);
      hc_head_norm_cuda(ctx, hp, dx.as<float>(), T, hpart2.ptr(), HcNormOut{wp, 1e-6f, hy2.ptr(), hyb.ptr()});
      ctx.sync();
      const std::vector<float> hgot = hy2.get(k);
      same(k, hgot, hy.get(k), "hc_head+rms_norm, " + shw);
      std::vector<uint16_t> hcast(hgot.size());
      for (size_t i = 0; i < hgot.size(); ++i) hcast[i] = f32_to_bf16(hgot[i]);
      same(k, hyb.get(k), hcast, "hc_head+rms_norm bf16 copy (round to nearest even), " + shw);
      (void)hpart.get(k), (void)hpart2.get(k);
      const HcHeadParams chp{head.fn.data(), head.base.data(), head.scale.data(), hc, D, 1e-6f, 1e-6f};
      std::vector<float> ch(size_t(T * D)), chy(size_t(T * D));
      hc_head_cpu(chp, x.data(), T, ch.data());
      rms_norm_cpu(ch.data(), weighted ? w.data() : nullptr, T, D, 1e-6f, chy.data());
      err(k, "hc_head+rms_norm", shw, max_rel(hgot, chy), 1e-4);
    }
  }
  // Rows longer than the shared-memory row the fused norm stages are refused by name.
  Rng r2(2);
  const HcSet big(r2, 1, 12289, false);
  cuda::DeviceBuffer bx(12289 * 4), by(12289 * 4), bp(4), bc(4), bs(hc_mix_scratch_floats(1, 12289, 1) * 4);
  throws(k, [&] { hc_pre_norm_cuda(ctx, big.gpu(1, 12289), bx.as<float>(), 1, nullptr, bp.as<float>(), bc.as<float>(),
                                bs.as<float>(), HcNormOut{nullptr, 1e-6f, by.as<float>(), nullptr}); }, "refusal");
}


}  // namespace

void add_fused_cases(std::vector<OpCase>& out) {
  const char* kFusedMetric = "bits vs the unfused kernels; max|d|/max|ref| vs the CPU (1e-5 f32, 1e-4 mHC, 8e-3 bf16)";
  add_case(out, check_only_case("fused", "norm_with_bf16_copy", NormWithBf16CopyGivesTheCastBits, kFusedMetric));
  add_case(out, check_only_case("fused", "two_norms_one_launch", TwoNormsInOneLaunchGiveTheirOwnBits, kFusedMetric));
  add_case(out, check_only_case("fused", "hc_post_with_next_pre_partials", HcPostWithNextPrePartialsGivesTheUnfusedBits, kFusedMetric));
  add_case(out, check_only_case("fused", "hc_finish_with_norm", HcFinishWithNormGivesTheUnfusedBits, kFusedMetric));
}

}  // namespace cm::optable
