// The step's smaller ops in the op table, each against its CPU op: embedding,
// RMSNorm (+ fused RoPE), RoPE, mHC pre/post/head, the router, the dense
// linears (cuBLAS entry and the batch-invariant kernel), SwiGLU, the
// non-finite counter and the device tensor statistics. Shapes include
// V4-Flash's (hidden 4096, hc 4, 64 heads x 512, rope 64, 256 experts top-6).
// Metric: max|gpu - cpu| / max|cpu|; bounds:
//  - f32 outputs of the same fp32 math in another summation order: 1e-5
//    (norms over <= 4096 terms) or 1e-4 (mHC: dot products over 16384 terms,
//    then sigmoid and 39 Sinkhorn divisions; dense linears through cuBLAS);
//  - bf16 outputs: 8e-3 (bf16 keeps 8 significant bits: rounding costs up to
//    2^-8 of a value just above a power of two, hence of max|ref|; twice that);
//  - discrete outputs (embedding bits, router ids, counts): exact.
// Bit contracts: hc_pre and the dense kernel give a token alone the bits it
// gets inside the batch; tensor stats are the same bits on a second run.
#include <cmath>
#include <cstring>
#include <memory>
#include <tuple>

#include "backend/cuda/linear/linear.h"
#include "backend/cuda/step/step_kernels.h"
#include "bench/optable/op_case.h"
#include "bench/optable/op_util.h"
#include "common/error.h"
#include "ops/hc.h"
#include "ops/linear.h"
#include "ops/norm.h"
#include "ops/rope.h"
#include "ops/router.h"
#include "ops/stats.h"
#include "ops/swiglu.h"

namespace cm::optable {
namespace {

// A case's instance from two closures over its state: the timed op and the check.
class Lambda : public OpRun {
 public:
  std::function<void(cuda::Context&)> op;
  std::function<void(cuda::Context&, Checker&)> chk;
  double nbytes = 0;
  void run(cuda::Context& ctx, int) override { op(ctx); }
  void check(cuda::Context& ctx, Checker& c) override { chk(ctx, c); }
  double bytes() const override { return nbytes; }
};

OpCase make_case(const std::string& family, std::vector<std::pair<std::string, int64_t>> shape, const std::string& metric,
                 double tol, std::function<std::unique_ptr<OpRun>(cuda::Context&, uint64_t)> make,
                 const std::string& suffix = "") {
  OpCase c;
  c.family = family;
  c.shape = std::move(shape);
  c.name = case_name(family, c.shape, suffix);
  c.metric = metric;
  c.tol = tol;
  c.bench = false;
  c.make = [make](cuda::Context& ctx, const MakeOptions& o) { return make(ctx, o.seed); };
  return c;
}

// ---- embedding: rows bit-exact against linear_expand_row, an out-of-range token gives NaN ----
std::unique_ptr<OpRun> embed(uint64_t seed, WeightFormat f) {
  struct S {
    LinearWeight w;
    cuda::DeviceBuffer d, s, dt;
    std::vector<int32_t> tok;
    std::unique_ptr<Guarded<float>> x;
    DeviceWeightView v{};
  };
  auto st = std::make_shared<S>();
  Rng r(seed);
  const int64_t rows = 1000, dim = 4096, hc = 4;
  LinearWeight& w = st->w;
  if (f == WeightFormat::NVFP4) {
    w = random_nvfp4(rows, dim, seed, 0.03f);
  } else {
    w.format = f;
    w.out_features = rows;
    w.in_features = dim;
    w.owned.resize(size_t(rows * dim) * (f == WeightFormat::F32 ? 4 : 2));
    for (auto& b : w.owned) b = uint8_t(r.next() >> 56);
    if (f == WeightFormat::F32)  // keep the values finite
      for (size_t i = 3; i < w.owned.size(); i += 4) w.owned[i] &= 0x3f;
    w.data = w.owned.data();
  }
  st->d = to_device(w.owned);
  st->s = to_device(w.owned_scale);
  st->v = DeviceWeightView{f, st->d.get(), f == WeightFormat::NVFP4 ? st->s.get() : nullptr, w.scale_2, rows, dim};
  st->tok = {0, 999, 17, 17, 500, 3, 998, int32_t(rows)};  // the last one is out of range
  st->dt = to_device(st->tok);
  st->x = std::make_unique<Guarded<float>>(st->tok.size() * hc * dim);
  auto l = std::make_unique<Lambda>();
  l->op = [st](cuda::Context& ctx) {
    embed_rows_cuda(ctx, st->v, st->dt.as<int32_t>(), int64_t(st->tok.size()), 4, st->x->ptr());
  };
  l->chk = [st, op = l->op](cuda::Context& ctx, Checker& c) {
    op(ctx);
    ctx.sync();
    const std::vector<float> got = st->x->get(c);
    std::vector<float> row(size_t(4096));
    int64_t mismatches = 0, notnan = 0;
    for (size_t t = 0; t + 1 < st->tok.size(); ++t) {
      linear_expand_row(st->w, st->tok[t], row.data());
      for (size_t k = 0; k < 4; ++k)
        for (size_t j = 0; j < 4096; ++j) mismatches += bits_from_f32(got[(t * 4 + k) * 4096 + j]) != bits_from_f32(row[j]);
    }
    for (size_t j = 0; j < 4 * 4096; ++j) notnan += !std::isnan(got[(st->tok.size() - 1) * 4 * 4096 + j]);
    c.expect(mismatches == 0, std::to_string(mismatches) + " embedding values differ from the CPU row bits");
    c.expect(notnan == 0, "the out-of-range token's rows must be NaN");
  };
  l->nbytes = double(st->tok.size()) * 4096 * (4 * 4 + 2);
  return l;
}

// ---- RMSNorm, optionally weighted, f32 or bf16 out, optionally fused RoPE ----
struct NormCase {
  int64_t rows, dim, rope_dim, rows_per_pos;
  bool weighted, bf16_out, yarn;
};

std::unique_ptr<OpRun> norm(uint64_t seed, NormCase nc) {
  struct S {
    std::vector<float> x, w, ref;
    std::vector<int32_t> pos;
    RopeTable tab;
    cuda::DeviceBuffer dx, dw, dp, df;
    std::unique_ptr<Guarded<float>> yf;
    std::unique_ptr<Guarded<uint16_t>> yb;
  };
  auto st = std::make_shared<S>();
  Rng r(seed);
  st->x = rand_f32(size_t(nc.rows * nc.dim), r, 3.0f, 0.5f);
  st->w = rand_f32(size_t(nc.dim), r, 0.5f, 1.0f);
  const int64_t npos = nc.rows / nc.rows_per_pos;
  st->pos.resize(size_t(npos));
  for (int64_t i = 0; i < npos; ++i) st->pos[size_t(i)] = int32_t(i * 997 + 4096);  // contexts past 4K
  st->tab = make_rope(nc.rope_dim ? nc.rope_dim : 8, nc.rope_dim == 64);
  st->dx = to_device(st->x);
  st->dw = to_device(st->w);
  st->dp = to_device(st->pos);
  st->df = to_device(st->tab.freqs);
  const size_t n = size_t(nc.rows * nc.dim);
  st->yf = std::make_unique<Guarded<float>>(n);
  st->yb = std::make_unique<Guarded<uint16_t>>(n);
  auto l = std::make_unique<Lambda>();
  l->op = [st, nc](cuda::Context& ctx) {
    RopeView rv{st->df.as<float>(), st->tab.rope_dim, 1.0f};
    rms_norm_cuda(ctx, st->dx.as<float>(), nc.weighted ? st->dw.as<float>() : nullptr, nc.rows, nc.dim, 1e-6f,
                  nc.bf16_out ? static_cast<void*>(st->yb->ptr()) : st->yf->ptr(), nc.bf16_out,
                  nc.rope_dim ? &rv : nullptr, st->dp.as<int32_t>(), nc.rows_per_pos);
  };
  l->chk = [st, nc, op = l->op](cuda::Context& ctx, Checker& c) {
    op(ctx);
    ctx.sync();
    std::vector<float> ref(size_t(nc.rows * nc.dim));
    rms_norm_cpu(st->x.data(), nc.weighted ? st->w.data() : nullptr, nc.rows, nc.dim, 1e-6f, ref.data());
    if (nc.rope_dim)
      for (int64_t row = 0; row < nc.rows; ++row)
        rope_apply_cpu(&ref[size_t(row * nc.dim)], 1, nc.dim, st->pos[size_t(row / nc.rows_per_pos)], st->tab, false);
    const std::vector<float> got = nc.bf16_out ? bf16_vals(st->yb->get(c)) : st->yf->get(c);
    c.err(nc.rope_dim ? "rms_norm+rope max|d|/max|ref|" : "rms_norm max|d|/max|ref|", max_rel(got, ref),
          nc.bf16_out ? 8e-3 : 1e-5);
  };
  l->nbytes = double(nc.rows * nc.dim) * (4 + (nc.bf16_out ? 2 : 4));
  return l;
}

// ---- RoPE forward and inverse, f32 or bf16 in and out (bf16 in place) ----
struct RopeCase {
  int64_t rows, dim, rope_dim, rows_per_pos;
  bool yarn, inverse, in_bf16, out_bf16;
};

std::unique_ptr<OpRun> rope(uint64_t seed, RopeCase rc) {
  struct S {
    RopeTable tab;
    std::vector<float> xv;
    std::vector<uint16_t> xb;
    std::vector<int32_t> pos;
    cuda::DeviceBuffer dx, dp, df;
    std::unique_ptr<Guarded<float>> yf;
    std::unique_ptr<Guarded<uint16_t>> yb;
  };
  auto st = std::make_shared<S>();
  Rng r(seed);
  st->tab = make_rope(rc.rope_dim, rc.yarn);
  const size_t n = size_t(rc.rows * rc.dim);
  st->xb = rand_bf16(n, r, 2.0f, &st->xv);
  const int64_t npos = rc.rows / rc.rows_per_pos;
  st->pos.resize(size_t(npos));
  for (int64_t i = 0; i < npos; ++i) st->pos[size_t(i)] = int32_t((i * 131071) % 1000000);  // up to 1M
  st->dx = rc.in_bf16 ? to_device(st->xb) : to_device(st->xv);
  st->dp = to_device(st->pos);
  st->df = to_device(st->tab.freqs);
  st->yf = std::make_unique<Guarded<float>>(n);
  st->yb = std::make_unique<Guarded<uint16_t>>(n);
  const bool in_place = rc.in_bf16 && rc.out_bf16;
  auto l = std::make_unique<Lambda>();
  l->op = [st, rc, in_place](cuda::Context& ctx) {
    RopeView rv{st->df.as<float>(), st->tab.rope_dim, 1.0f};
    void* y = in_place ? st->dx.get() : rc.out_bf16 ? static_cast<void*>(st->yb->ptr()) : st->yf->ptr();
    rope_cuda(ctx, st->dx.get(), rc.in_bf16, y, rc.out_bf16, rc.rows, rc.dim, st->dp.as<int32_t>(), rc.rows_per_pos, rv,
              rc.inverse);
  };
  l->chk = [st, rc, in_place, op = l->op](cuda::Context& ctx, Checker& c) {
    if (in_place) st->dx.upload(st->xb.data(), st->xb.size() * 2);  // fresh input (the bench may have run it)
    op(ctx);
    ctx.sync();
    const size_t n = size_t(rc.rows * rc.dim);
    const std::vector<float> got = in_place      ? bf16_vals(from_device<uint16_t>(st->dx, n))
                                   : rc.out_bf16 ? bf16_vals(st->yb->get(c))
                                                 : st->yf->get(c);
    std::vector<float> ref = st->xv;
    for (int64_t row = 0; row < rc.rows; ++row)
      rope_apply_cpu(&ref[size_t(row * rc.dim)], 1, rc.dim, st->pos[size_t(row / rc.rows_per_pos)], st->tab, rc.inverse);
    c.err(rc.inverse ? "rope inverse max|d|/max|ref|" : "rope max|d|/max|ref|", max_rel(got, ref),
          rc.out_bf16 ? 8e-3 : 1e-5);
  };
  l->nbytes = double(rc.rows * rc.dim) * ((rc.in_bf16 ? 2 : 4) + (rc.out_bf16 ? 2 : 4));
  return l;
}

// ---- mHC: hc_pre (collapsed, post, Sinkhorn comb; a token alone = in the batch, bit for bit), hc_post in place on
// the CPU's post/comb, hc_head. The timed op is hc_pre. ----
std::unique_ptr<OpRun> hyper(uint64_t seed, int64_t T, int64_t hc, int64_t D) {
  struct S {
    std::vector<float> x, fn, base, scale, hfn, hbase, hscale;
    cuda::DeviceBuffer dx, dfn, db, ds, dhfn, dhb, dhs;
    std::unique_ptr<Guarded<float>> a, post, comb, part;
    Rng r{0};
  };
  auto st = std::make_shared<S>();
  st->r = Rng(seed);
  Rng& r = st->r;
  const int64_t n = hc * D, R = (2 + hc) * hc;
  st->x = rand_f32(size_t(T * n), r, 1.0f, 0.1f);
  st->fn = rand_f32(size_t(R * n), r, 0.02f);
  st->base = rand_f32(size_t(R), r, 0.5f);
  st->scale = {0.7f, 1.3f, 2.0f};
  st->hfn = rand_f32(size_t(hc * n), r, 0.02f);
  st->hbase = rand_f32(size_t(hc), r, 0.5f);
  st->hscale = {1.1f};
  st->dx = to_device(st->x);
  st->dfn = to_device(st->fn);
  st->db = to_device(st->base);
  st->ds = to_device(st->scale);
  st->dhfn = to_device(st->hfn);
  st->dhb = to_device(st->hbase);
  st->dhs = to_device(st->hscale);
  st->a = std::make_unique<Guarded<float>>(size_t(T * D));
  st->post = std::make_unique<Guarded<float>>(size_t(T * hc));
  st->comb = std::make_unique<Guarded<float>>(size_t(T * hc * hc));
  st->part = std::make_unique<Guarded<float>>(hc_mix_scratch_floats(hc, D, T));
  auto l = std::make_unique<Lambda>();
  l->op = [st, T, hc, D](cuda::Context& ctx) {
    HcParams gp{st->dfn.as<float>(), st->db.as<float>(), st->ds.as<float>(), hc, D, 20, 1e-6f, 1e-6f};
    hc_pre_cuda(ctx, gp, st->dx.as<float>(), T, st->a->ptr(), st->post->ptr(), st->comb->ptr(), st->part->ptr());
  };
  l->chk = [st, T, hc, D, op = l->op](cuda::Context& ctx, Checker& c) {
    const int64_t n = hc * D;
    op(ctx);
    HcParams cp{st->fn.data(), st->base.data(), st->scale.data(), hc, D, 20, 1e-6f, 1e-6f};
    HcParams gp{st->dfn.as<float>(), st->db.as<float>(), st->ds.as<float>(), hc, D, 20, 1e-6f, 1e-6f};
    std::vector<float> ra(size_t(T * D)), rpost(size_t(T * hc)), rcomb(size_t(T * hc * hc));
    hc_pre_cpu(cp, st->x.data(), T, ra.data(), rpost.data(), rcomb.data());
    ctx.sync();
    const std::vector<float> all = st->a->get(c, "collapsed"), callc = st->comb->get(c, "comb");
    c.err("hc_pre collapsed", max_rel(all, ra), 1e-4);
    c.err("hc_pre post", max_rel(st->post->get(c, "post"), rpost), 1e-4);
    c.err("hc_pre comb (Sinkhorn)", max_rel(callc, rcomb), 1e-4);
    (void)st->part->get(c, "partial sums");
    {  // the last token alone gives the bits it gets inside the batch
      Guarded<float> a1{size_t(D)}, post1{size_t(hc)}, comb1{size_t(hc * hc)}, part1{hc_mix_scratch_floats(hc, D, 1)};
      hc_pre_cuda(ctx, gp, st->dx.as<float>() + (T - 1) * n, 1, a1.ptr(), post1.ptr(), comb1.ptr(), part1.ptr());
      ctx.sync();
      const std::vector<float> one = a1.get(c), conec = comb1.get(c);
      c.same_bits(one.data(), all.data() + (T - 1) * D, size_t(D) * 4, "hc_pre collapsed, last token alone");
      c.same_bits(conec.data(), callc.data() + (T - 1) * hc * hc, size_t(hc * hc) * 4, "hc_pre comb, last token alone");
    }
    // hc_post on the CPU's post/comb (so only the post op is measured), in place
    std::vector<float> out = rand_f32(size_t(T * D), st->r, 1.0f);
    cuda::DeviceBuffer dout = to_device(out), dpost = to_device(rpost), dcomb = to_device(rcomb), dx2 = to_device(st->x);
    hc_post_cuda(ctx, hc, D, dout.as<float>(), dpost.as<float>(), dcomb.as<float>(), T, dx2.as<float>());
    std::vector<float> rx = st->x;
    hc_post_cpu(hc, D, out.data(), rpost.data(), rcomb.data(), T, rx.data());
    ctx.sync();
    c.err("hc_post", max_rel(from_device<float>(dx2, rx.size()), rx), 1e-5);
    HcHeadParams hp{st->hfn.data(), st->hbase.data(), st->hscale.data(), hc, D, 1e-6f, 1e-6f};
    HcHeadParams ghp{st->dhfn.as<float>(), st->dhb.as<float>(), st->dhs.as<float>(), hc, D, 1e-6f, 1e-6f};
    Guarded<float> y(size_t(T * D)), hpart(hc_mix_scratch_floats(hc, D, T));
    hc_head_cuda(ctx, ghp, st->dx.as<float>(), T, y.ptr(), hpart.ptr());
    std::vector<float> ry(size_t(T * D));
    hc_head_cpu(hp, st->x.data(), T, ry.data());
    ctx.sync();
    c.err("hc_head", max_rel(y.get(c, "hc_head"), ry), 1e-4);
    (void)hpart.get(c, "hc_head partial sums");
  };
  l->nbytes = double(T * hc * D) * 4 + double((2 + hc) * hc * hc * D) * 4;
  return l;
}

// ---- the router: score (sqrt-softplus + bias, top-k) and hash layers; ties, the softplus threshold, NaN logits ----
std::unique_ptr<OpRun> router(uint64_t seed, int64_t T, int64_t E, int64_t K, bool hash) {
  struct S {
    std::vector<float> logits, ref_logits, bias;
    std::vector<int32_t> tid2eid, tok;
    cuda::DeviceBuffer dl, dbias, dtid, dtok;
    std::unique_ptr<Guarded<int32_t>> idx;
    std::unique_ptr<Guarded<float>> w;
  };
  auto st = std::make_shared<S>();
  Rng r(seed);
  auto& logits = st->logits;
  logits = rand_f32(size_t(T * E), r, 4.0f);
  for (int64_t e = 0; e < E; e += 7) logits[size_t(e)] = logits[1];              // exact ties in token 0
  for (int64_t e = 0; e < E; ++e) logits[size_t(E + e)] = 25.0f + float(e % 3);  // softplus threshold, ties
  // NaN logits in token 2: the GPU router reads them as -inf, so the reference gets -inf there; the highest
  // logit of the row is one of them.
  st->ref_logits = logits;
  int64_t top = 0;
  for (int64_t e = 1; e < E; ++e) top = logits[size_t(2 * E + e)] > logits[size_t(2 * E + top)] ? e : top;
  for (int64_t e : {top, int64_t(3), E - 1}) {
    logits[size_t(2 * E + e)] = NAN;
    st->ref_logits[size_t(2 * E + e)] = -INFINITY;
  }
  st->bias = rand_f32(size_t(E), r, 0.1f);
  for (int64_t e = 0; e < E; ++e) st->bias[size_t(e)] = e % 5 == 0 ? 0.0f : st->bias[size_t(e)];
  const int64_t vocab = 50;
  st->tid2eid.resize(size_t(vocab * K));
  st->tok.resize(size_t(T));
  for (auto& v : st->tid2eid) v = int32_t(r.next() % uint64_t(E));
  for (auto& v : st->tok) v = int32_t(r.next() % uint64_t(vocab));
  st->dl = to_device(logits);
  st->dbias = to_device(st->bias);
  st->dtid = to_device(st->tid2eid);
  st->dtok = to_device(st->tok);
  st->idx = std::make_unique<Guarded<int32_t>>(size_t(T * K));
  st->w = std::make_unique<Guarded<float>>(size_t(T * K));
  auto l = std::make_unique<Lambda>();
  l->op = [st, T, E, K, hash](cuda::Context& ctx) {
    RouterParams gp{E, K, 1.5f, st->dbias.as<float>(), hash ? st->dtid.as<int32_t>() : nullptr, 50};
    route_cuda(ctx, gp, st->dtok.as<int32_t>(), st->dl.as<float>(), T, st->idx->ptr(), st->w->ptr());
  };
  l->chk = [st, T, E, K, hash, op = l->op](cuda::Context& ctx, Checker& c) {
    op(ctx);
    RouterParams cp{E, K, 1.5f, st->bias.data(), hash ? st->tid2eid.data() : nullptr, 50};
    std::vector<int32_t> ridx(size_t(T * K));
    std::vector<float> rw(size_t(T * K));
    route_cpu(cp, st->tok.data(), st->ref_logits.data(), T, ridx.data(), rw.data());
    ctx.sync();
    const std::vector<int32_t> idx = st->idx->get(c, "ids");
    c.expect(idx == ridx, "routing ids differ from the CPU router");
    c.err("router weights max|d|/max|ref|", max_rel(st->w->get(c, "weights"), rw), 1e-5);
  };
  l->nbytes = double(T * E) * 4;
  return l;
}

// ---- linear_dense_cuda (cuBLAS): BF16 weight with f32 and bf16 outputs, F32 weight (bf16 x refused), alpha ----
std::unique_ptr<OpRun> dense_cublas(uint64_t seed, int64_t M, int64_t N, int64_t K) {
  struct S {
    std::vector<float> wv, xv, ref;
    std::vector<uint16_t> wb, xb;
    cuda::DeviceBuffer dwb, dxb, dwf, dxf;
    std::unique_ptr<Guarded<float>> y;
  };
  auto st = std::make_shared<S>();
  Rng r(seed);
  st->wb = rand_bf16(size_t(N * K), r, 0.05f, &st->wv);
  st->xb = rand_bf16(size_t(M * K), r, 1.0f, &st->xv);
  st->dwb = to_device(st->wb);
  st->dxb = to_device(st->xb);
  st->dwf = to_device(st->wv);
  st->dxf = to_device(st->xv);
  st->y = std::make_unique<Guarded<float>>(size_t(M * N));
  auto l = std::make_unique<Lambda>();
  l->op = [st, M, N, K](cuda::Context& ctx) {
    DeviceWeightView v{WeightFormat::BF16, st->dwb.get(), nullptr, 1.0f, N, K};
    linear_dense_cuda(ctx, v, st->dxb.get(), true, M, K, st->y->ptr(), false, N);
  };
  l->chk = [st, M, N, K, op = l->op](cuda::Context& ctx, Checker& c) {
    std::vector<float> ref(size_t(M * N));
    LinearWeight cw = linear_from_f32("test.dense", N, K, st->wv.data());
    linear_cpu(cw, st->xv.data(), M, ref.data());
    op(ctx);
    ctx.sync();
    c.err("linear BF16 -> f32", max_rel(st->y->get(c, "bf16 weight f32 out"), ref), 1e-4);
    DeviceWeightView vb{WeightFormat::BF16, st->dwb.get(), nullptr, 1.0f, N, K};
    Guarded<uint16_t> yb(size_t(M * N));
    linear_dense_cuda(ctx, vb, st->dxb.get(), true, M, K, yb.ptr(), true, N);
    ctx.sync();
    c.err("linear BF16 -> bf16", max_rel(bf16_vals(yb.get(c, "bf16 out")), ref), 8e-3);
    DeviceWeightView vf{WeightFormat::F32, st->dwf.get(), nullptr, 1.0f, N, K};
    Guarded<float> yf(size_t(M * N));
    linear_dense_cuda(ctx, vf, st->dxf.get(), false, M, K, yf.ptr(), false, N);
    ctx.sync();
    c.err("linear F32 -> f32", max_rel(yf.get(c, "f32 weight"), ref), 1e-4);
    bool threw = false;
    try {
      linear_dense_cuda(ctx, vf, st->dxf.get(), true, M, K, yf.ptr(), false, N);
    } catch (const Error&) {
      threw = true;
    }
    c.expect(threw, "an F32 weight with bf16 x must be refused");
    // alpha scales the product (the indexer's 1/sqrt(heads))
    linear_dense_cuda(ctx, vf, st->dxf.get(), false, M, K, yf.ptr(), false, N, 0.125f);
    for (float& f : ref) f *= 0.125f;
    ctx.sync();
    c.err("linear F32 alpha=1/8", max_rel(yf.get(c, "alpha"), ref), 1e-4);
  };
  l->nbytes = double(N * K) * 2 + double(M * K) * 2 + double(M * N) * 4;
  return l;
}

// ---- dense_linear (the batch-invariant kernel) against a double reference; the last row alone = in the batch ----
// variant 0: BF16 W, f32 x; 1: BF16 W, bf16 x; 2: F32 W, f32 x.
std::unique_ptr<OpRun> dense(uint64_t seed, int64_t M, int64_t N, int64_t K, int groups, int variant) {
  struct S {
    std::vector<float> ref;
    cuda::DeviceBuffer dw, dx;
    std::unique_ptr<Guarded<float>> y;
  };
  auto st = std::make_shared<S>();
  Rng r(seed);
  const int64_t ldx = groups * K;
  const bool wbf = variant < 2, xbf = variant == 1;
  std::vector<float> wv;
  std::vector<uint16_t> wb = rand_bf16(size_t(N * K), r, 0.05f, &wv);
  std::vector<float> x = rand_f32(size_t(M * ldx), r, 1.0f);
  std::vector<uint16_t> xb(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    xb[i] = f32_to_bf16(x[i]);
    if (xbf) x[i] = bf16_to_f32(xb[i]);
  }
  st->ref.resize(size_t(M * N));
  const int64_t rpg = N / groups;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double acc = 0;
      const int64_t g = n / rpg;
      for (int64_t k = 0; k < K; ++k) acc += double(x[size_t(m * ldx + g * K + k)]) * double(wv[size_t(n * K + k)]);
      st->ref[size_t(m * N + n)] = float(acc);
    }
  st->dw = wbf ? to_device(wb) : to_device(wv);
  st->dx = xbf ? to_device(xb) : to_device(x);
  st->y = std::make_unique<Guarded<float>>(size_t(M * N));
  auto l = std::make_unique<Lambda>();
  l->op = [st, M, N, K, groups, wbf, xbf, ldx](cuda::Context& ctx) {
    cuda::dense_linear(ctx, st->dw.get(), wbf, N, K, groups, st->dx.get(), xbf, M, ldx, st->y->ptr(), false, N, 1.0f);
  };
  l->chk = [st, M, N, K, groups, wbf, xbf, ldx, op = l->op](cuda::Context& ctx, Checker& c) {
    op(ctx);
    Guarded<float> y1{size_t(N)};
    const size_t es = xbf ? 2 : 4;
    const int64_t last = M - 1;
    cuda::dense_linear(ctx, st->dw.get(), wbf, N, K, groups, static_cast<const char*>(st->dx.get()) + last * ldx * es,
                       xbf, 1, ldx, y1.ptr(), false, N, 1.0f);
    ctx.sync();
    const std::vector<float> all = st->y->get(c), one = y1.get(c, "last row alone");
    c.err("dense linear max|d|/max|ref|", max_rel(all, st->ref), 1e-5);
    c.same_bits(one.data(), all.data() + last * N, size_t(N) * 4, "row " + std::to_string(last) + " alone vs in the batch");
  };
  l->nbytes = double(N * K) * (wbf ? 2 : 4) + double(M * ldx) * (xbf ? 2 : 4) + double(M * N) * 4;
  return l;
}

// ---- the step's non-finite counter: 16 intermediates in one launch, f32 and bf16, aligned and unaligned rows ----
std::unique_ptr<OpRun> nonfinite(uint64_t seed) {
  struct Case {
    int64_t width;
    bool bf16;
    int64_t offset;  // elements: 1 makes the rows unaligned
  };
  struct S {
    std::vector<Case> cases;
    cuda::NonFiniteBatch b;
    std::vector<cuda::DeviceBuffer> bufs;
    std::vector<std::vector<int32_t>> want;
    std::vector<std::unique_ptr<Guarded<int32_t>>> outs;
  };
  auto st = std::make_shared<S>();
  Rng r(seed);
  const int64_t rows = 5;
  st->cases = {{32768, true, 0}, {4096, false, 0}, {512, false, 1}, {64, true, 1},    {37, true, 0},  {16384, false, 0},
               {1000, false, 0}, {999, true, 1},   {4096, true, 0}, {512, true, 0},   {128, false, 1}, {33, false, 0},
               {8192, true, 1},  {2048, false, 0}, {16, true, 0},   {7, false, 1}};
  const float bad_vals[3] = {NAN, INFINITY, -INFINITY};
  for (const Case& cs : st->cases) {
    const size_t n = size_t(rows * cs.width + cs.offset);
    std::vector<float> v = rand_f32(n, r, 1.0f);
    std::vector<int32_t> cnt(size_t(rows), 0);
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t k = int64_t(r.uniform() * 6.0f);  // 0..5 bad values in this row
      for (int64_t j = 0; j < k; ++j) {
        const size_t at = size_t(cs.offset + i * cs.width + int64_t(r.uniform() * float(cs.width - 1)));
        if (std::isfinite(v[at])) ++cnt[size_t(i)];
        v[at] = bad_vals[j % 3];
      }
    }
    if (cs.bf16) {
      std::vector<uint16_t> h(n);
      for (size_t i = 0; i < n; ++i) h[i] = f32_to_bf16(v[i]);
      st->bufs.push_back(to_device(h));
    } else {
      st->bufs.push_back(to_device(v));
    }
    st->outs.push_back(std::make_unique<Guarded<int32_t>>(size_t(rows)));
    st->want.push_back(cnt);
    const int i = st->b.count++;
    st->b.x[i] = static_cast<const char*>(st->bufs.back().get()) + cs.offset * (cs.bf16 ? 2 : 4);
    st->b.width[i] = cs.width;
    st->b.bf16[i] = cs.bf16;
    st->b.out[i] = st->outs.back()->ptr();
  }
  auto l = std::make_unique<Lambda>();
  l->op = [st](cuda::Context& ctx) { cuda::count_non_finite(ctx, st->b, 5); };
  l->chk = [st, op = l->op](cuda::Context& ctx, Checker& c) {
    c.expect(st->cases.size() == size_t(cuda::NonFiniteBatch::kMax), "the case fills a launch");
    op(ctx);
    ctx.sync();
    for (size_t i = 0; i < st->cases.size(); ++i)
      c.expect(st->outs[i]->get(c) == st->want[i], "counts differ: width " + std::to_string(st->cases[i].width) +
                                                       (st->cases[i].bf16 ? " bf16" : " f32") + " offset " +
                                                       std::to_string(st->cases[i].offset));
    cuda::NonFiniteBatch too_many;
    too_many.count = cuda::NonFiniteBatch::kMax + 1;
    bool threw = false;
    try {
      cuda::count_non_finite(ctx, too_many, 5);
    } catch (const Error&) {
      threw = true;
    }
    c.expect(threw, "more than kMax intermediates must be refused");
  };
  return l;
}

// ---- SwiGLU with the clamp (limit 10) and a per-row weight, f32 and bf16 outputs ----
std::unique_ptr<OpRun> swiglu(uint64_t seed, int64_t rows, int64_t cols) {
  struct S {
    std::vector<float> gu, wt;
    cuda::DeviceBuffer dgu, dwt;
    std::unique_ptr<Guarded<float>> hf;
  };
  auto st = std::make_shared<S>();
  Rng r(seed);
  // gate and up as the two halves of one fused output row, values past the limit 10
  st->gu = rand_f32(size_t(rows * 2 * cols), r, 15.0f);
  st->wt = rand_f32(size_t(rows), r, 0.5f, 1.0f);
  st->dgu = to_device(st->gu);
  st->dwt = to_device(st->wt);
  st->hf = std::make_unique<Guarded<float>>(size_t(rows * cols));
  auto l = std::make_unique<Lambda>();
  l->op = [st, rows, cols](cuda::Context& ctx) {
    const float* g = st->dgu.as<float>();
    swiglu_cuda(ctx, g, g + cols, 2 * cols, rows, cols, 10.0f, st->dwt.as<float>(), st->hf->ptr(), false);
  };
  l->chk = [st, rows, cols, op = l->op](cuda::Context& ctx, Checker& c) {
    std::vector<float> ref(size_t(rows * cols));
    for (int64_t row = 0; row < rows; ++row) {
      swiglu_cpu(&st->gu[size_t(row * 2 * cols)], &st->gu[size_t(row * 2 * cols + cols)], cols, 10.0f,
                 &ref[size_t(row * cols)]);
      for (int64_t k = 0; k < cols; ++k) ref[size_t(row * cols + k)] *= st->wt[size_t(row)];
    }
    op(ctx);
    Guarded<uint16_t> hb(size_t(rows * cols));
    const float* g = st->dgu.as<float>();
    swiglu_cuda(ctx, g, g + cols, 2 * cols, rows, cols, 10.0f, st->dwt.as<float>(), hb.ptr(), true);
    ctx.sync();
    c.err("swiglu -> f32", max_rel(st->hf->get(c, "f32 out"), ref), 1e-5);
    c.err("swiglu -> bf16", max_rel(bf16_vals(hb.get(c, "bf16 out")), ref), 8e-3);
  };
  l->nbytes = double(rows * cols) * 12;
  return l;
}

// ---- device tensor statistics against the CPU observer's; a second run gives the same bits ----
void stats_check(cuda::Context& ctx, Checker& c) {
  Rng r(8);
  const int64_t T = 37, hc = 4, D = 4096;
  std::vector<float> x = rand_f32(size_t(T * hc * D), r, 3.0f, 0.2f);
  x[5] = NAN;
  x[size_t(2 * D + 7)] = INFINITY;
  x[size_t((3 * hc + 1) * D + 9)] = -INFINITY;
  x[size_t((9 * hc + 1) * D)] = -1000.0f;  // the amax of stream 1
  cuda::DeviceBuffer dx = to_device(x);
  Guarded<DeviceTensorStats> out(size_t(hc + 1)), out2(size_t(hc + 1));
  DeviceTensorStats* o = out.ptr();
  DeviceTensorStats* o2 = out2.ptr();
  tensor_stats_cuda(ctx, dx.as<float>(), 1, T * hc * D, T * hc * D, o);
  tensor_stats_cuda(ctx, dx.as<float>(), 1, T * hc * D, T * hc * D, o2);
  for (int64_t k = 0; k < hc; ++k) {
    tensor_stats_cuda(ctx, dx.as<float>() + k * D, T, D, hc * D, o + 1 + k);
    tensor_stats_cuda(ctx, dx.as<float>() + k * D, T, D, hc * D, o2 + 1 + k);
  }
  ctx.sync();
  const std::vector<DeviceTensorStats> got = out.get(c), again = out2.get(c);
  c.same_bits(got.data(), again.data(), got.size() * sizeof(DeviceTensorStats), "stats of two runs");
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
    const std::string seg = "segment " + std::to_string(k);
    c.expect(g.amax == ref.amax, seg + " amax");
    c.expect(g.nan == ref.nan, seg + " nan count");
    c.expect(g.inf == ref.inf, seg + " inf count");
    c.expect(g.count == ref.count, seg + " count");
    c.expect(std::fabs(g.sum / double(g.count) - ref.mean) <= 1e-9 * std::max(1.0, std::fabs(ref.mean)), seg + " mean");
  }
}

}  // namespace

void add_basic_cases(std::vector<OpCase>& out) {
  const char* mr = "max|d|/max|ref|";
  for (WeightFormat f : {WeightFormat::F32, WeightFormat::BF16, WeightFormat::NVFP4})
    add_case(out, make_case("embed", {{"rows", 1000}, {"dim", 4096}, {"hc", 4}}, "bits", 0,
                            [f](cuda::Context&, uint64_t s) { return embed(s, f); }, weight_format_name(f)));
  const NormCase norms[] = {
      {7, 4096, 0, 1, true, true, false},        // attn_norm / ffn_norm -> bf16 for the next linear
      {5, 4096, 0, 1, true, false, false},       // final norm, f32
      {3, 1024, 0, 1, true, true, false},        // q_norm (q_lora 1024)
      {4 * 64, 512, 64, 64, false, true, true},  // per-head Q norm + RoPE, 64 heads x 512
      {9, 512, 64, 1, true, true, true},         // kv_norm + RoPE
      {6, 64, 8, 1, true, false, false},         // tiny fixture shape
  };
  for (const NormCase& n : norms)
    add_case(out, make_case("norm", {{"rows", n.rows}, {"dim", n.dim}, {"rope", n.rope_dim}, {"bf16", n.bf16_out},
                                     {"weighted", n.weighted}},
                            mr, n.bf16_out ? 8e-3 : 1e-5, [n](cuda::Context&, uint64_t s) { return norm(s, n); }));
  const RopeCase ropes[] = {
      {8 * 64, 128, 64, 64, true, false, false, true},  // indexer q: 64 heads x 128, f32 -> bf16
      {3 * 64, 512, 64, 64, true, true, false, false},  // inverse on attention output
      {5, 512, 64, 1, false, false, true, true},        // bf16 in place
      {7, 32, 8, 1, false, true, false, false},
  };
  for (const RopeCase& rc : ropes)
    add_case(out, make_case("rope", {{"rows", rc.rows}, {"dim", rc.dim}, {"rope", rc.rope_dim}, {"inv", rc.inverse},
                                     {"inbf16", rc.in_bf16}, {"outbf16", rc.out_bf16}},
                            mr, rc.out_bf16 ? 8e-3 : 1e-5, [rc](cuda::Context&, uint64_t s) { return rope(s, rc); }));
  for (auto [T, hc, D] : {std::tuple<int64_t, int64_t, int64_t>{5, 4, 4096}, {3, 4, 64}, {4, 2, 256}})
    add_case(out, make_case("hc", {{"T", T}, {"hc", hc}, {"D", D}}, mr, 1e-4,
                            [T = T, hc = hc, D = D](cuda::Context&, uint64_t s) { return hyper(s, T, hc, D); }));
  for (auto [T, E, K] : {std::tuple<int64_t, int64_t, int64_t>{37, 256, 6}, {9, 384, 6}, {11, 8, 2}, {5, 16, 4}})
    for (bool hash : {false, true})
      add_case(out, make_case("router", {{"T", T}, {"E", E}, {"topk", K}, {"hash", hash}}, "ids exact, weights " + std::string(mr),
                              1e-5, [T = T, E = E, K = K, hash](cuda::Context&, uint64_t s) { return router(s, T, E, K, hash); }));
  // router 4096 -> 256, compressor 4096 -> 1024, indexer weights_proj 4096 -> 64, tiny 64 -> 16
  for (auto [M, N, K] : {std::tuple<int64_t, int64_t, int64_t>{7, 256, 4096}, {33, 1024, 4096}, {3, 64, 4096}, {5, 16, 64}})
    add_case(out, make_case("dense_cublas", {{"M", M}, {"N", N}, {"K", K}}, mr, 1e-4,
                            [M = M, N = N, K = K](cuda::Context&, uint64_t s) { return dense_cublas(s, M, N, K); }));
  // the dense kernel: every tile shape, a ragged last tile, grouped weights, N not a multiple of 8, K in 1 to 16
  // chunks, K = 36 (SIMT for BF16)
  struct DC {
    int64_t M, N, K;
    int groups;
  };
  for (DC d : {DC{1, 256, 4096, 1}, DC{40, 256, 4096, 1}, DC{17, 1024, 4096, 1}, DC{33, 16, 64, 2},
               DC{40, 8192, 1024, 1}, DC{40, 64, 4104, 1}, DC{5, 20, 64, 1}, DC{7, 24, 36, 1}})
    for (int v = 0; v < 3; ++v)
      add_case(out, make_case("dense", {{"M", d.M}, {"N", d.N}, {"K", d.K}, {"G", d.groups}, {"variant", v}}, mr, 1e-5,
                              [d, v](cuda::Context&, uint64_t s) { return dense(s, d.M, d.N, d.K, d.groups, v); }));
  add_case(out, make_case("nonfinite", {{"rows", 5}, {"tensors", 16}}, "exact", 0,
                          [](cuda::Context&, uint64_t s) { return nonfinite(s); }));
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{7, 2048}, {3, 256}, {33, 64}})
    add_case(out, make_case("swiglu", {{"rows", rows}, {"cols", cols}}, mr, 8e-3,
                            [rows = rows, cols = cols](cuda::Context&, uint64_t s) { return swiglu(s, rows, cols); }));
  OpCase st = make_case("stats", {{"T", 37}, {"hc", 4}, {"D", 4096}}, "exact", 0, nullptr);
  st.check_only = true;
  st.make = [](cuda::Context&, const MakeOptions&) { return check_only_run(stats_check); };
  add_case(out, std::move(st));
}

}  // namespace cm::optable
