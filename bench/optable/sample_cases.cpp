// The row sampler (ops/sample.h) in the op table: the GPU's tokens and statuses against the CPU's,
// exactly (metric "tokens exact"; both run the same integer algorithm), the raw logprob within 2e-5
// (the CPU sums exp in double in id order, the GPU in float in its CTA's order), the adjusted logits and
// the adjustments' saved originals bit for bit, and each row alone giving the bits it gets in the batch.
// Rows mix every parameter: greedy, temperature, top-k, top-p, min-p, penalties, logit bias, masks, a
// non-finite row and a fully masked one; logits have exact ties at the maximum.
#include <cmath>
#include <cstring>
#include <functional>
#include <algorithm>
#include <memory>

#include "bench/optable/op_case.h"
#include "bench/optable/op_util.h"
#include "common/error.h"
#include "ops/sample.h"

namespace cm::optable {
namespace {

// A case's instance from two closures: the timed op and the check.
class SampleRun : public OpRun {
 public:
  std::function<void(cuda::Context&)> op;
  std::function<void(cuda::Context&, Checker&)> chk;
  double nbytes = 0;
  void run(cuda::Context& ctx, int) override { op(ctx); }
  void check(cuda::Context& ctx, Checker& c) override { chk(ctx, c); }
  double bytes() const override { return nbytes; }
};

struct SampleInputs {
  int64_t rows = 0, vocab = 0, words = 0;
  int32_t top_n = 0;  // the raw top logprobs asked for
  std::vector<float> logits;
  std::vector<SampleParams> params;
  std::vector<SampleAdjust> adj;
  std::vector<int64_t> off;
  std::vector<uint32_t> mask;
};

SampleInputs make_inputs(uint64_t seed, int64_t rows, int64_t vocab, int32_t top_n) {
  SampleInputs in;
  in.top_n = top_n;
  in.rows = rows;
  in.vocab = vocab;
  in.words = (vocab + 31) / 32;
  Rng r(seed);
  in.logits = rand_f32(size_t(rows * vocab), r, 8.0f);
  in.params.resize(size_t(rows));
  in.off.push_back(0);
  in.mask.assign(size_t(rows * in.words), 0xffffffffu);
  for (int64_t row = 0; row < rows; ++row) {
    float* l = &in.logits[size_t(row * vocab)];
    SampleParams& p = in.params[size_t(row)];
    const int kind = int(row % 9);
    p.seed = r.next();
    p.counter = r.next() % 4096;
    p.temperature = kind == 0 ? 0.0f : 0.3f + 1.2f * r.uniform();
    if (kind == 2 || kind == 6) p.top_k = int32_t(1 + r.next() % 100);
    if (kind == 3 || kind == 6) p.top_p = 0.5f + 0.49f * r.uniform();
    if (kind == 4) p.min_p = 0.05f + 0.3f * r.uniform();
    if (kind == 5) p.repetition_penalty = 1.3f, p.presence_penalty = 0.5f, p.frequency_penalty = 0.25f;
    // ties at the maximum: two ids share it
    const int64_t a = int64_t(r.next() % uint64_t(vocab)), b = int64_t(r.next() % uint64_t(vocab));
    l[a] = 12.0f;
    l[b] = 12.0f;
    // adjustments: a few biased and seen ids (distinct)
    // distinct ids: never more than half the vocabulary
    const int n_adj = int(std::min<int64_t>(kind == 5 || kind == 7 ? 40 : kind == 1 ? 3 : 0, vocab / 2));
    std::vector<int32_t> ids;
    for (int j = 0; j < n_adj; ++j) {
      int32_t id;
      do id = int32_t(r.next() % uint64_t(vocab));
      while (std::find(ids.begin(), ids.end(), id) != ids.end());
      ids.push_back(id);
      SampleAdjust e;
      e.id = id;
      e.count = kind == 5 ? int32_t(r.next() % 4) : 0;
      e.bias = kind == 7 ? (j == 0 ? 100.0f : -100.0f * r.uniform()) : 2.0f * r.uniform() - 1.0f;
      in.adj.push_back(e);
    }
    in.off.push_back(int64_t(in.adj.size()));
    uint32_t* m = &in.mask[size_t(row * in.words)];
    if (kind == 8) {  // a grammar-like mask: one allowed id in 5
      for (int64_t w = 0; w < in.words; ++w) m[w] = uint32_t(r.next()) & uint32_t(r.next()) & 0x55555555u;
      m[0] |= 1u;
    }
    if (rows > 4 && row == 3) l[vocab / 2] = NAN;                       // a non-finite row
    if (rows > 4 && row == 4) std::memset(m, 0, size_t(in.words) * 4);  // nothing allowed
  }
  return in;
}

struct SampleOut {
  std::vector<int32_t> token, status;
  std::vector<float> logprob, logits;
  std::vector<SampleAdjust> adj;
  std::vector<int32_t> top_id;
  std::vector<float> top_lp;
};

SampleOut run_cpu(SampleInputs in) {
  SampleOut o;
  o.token.resize(size_t(in.rows));
  o.status.resize(size_t(in.rows));
  o.logprob.resize(size_t(in.rows));
  o.top_id.resize(size_t(in.rows * in.top_n));
  o.top_lp.resize(size_t(in.rows * in.top_n));
  SampleArgs a;
  a.logits = in.logits.data(), a.rows = in.rows, a.vocab = in.vocab, a.params = in.params.data();
  a.adj = in.adj.empty() ? nullptr : in.adj.data();
  a.adj_offsets = in.adj.empty() ? nullptr : in.off.data();
  a.mask = in.mask.data(), a.mask_words = in.words;
  a.token = o.token.data(), a.logprob = o.logprob.data(), a.status = o.status.data();
  a.top_n = in.top_n, a.top_id = o.top_id.data(), a.top_logprob = o.top_lp.data();
  sample_rows_cpu(a);
  o.logits = std::move(in.logits);
  o.adj = std::move(in.adj);
  return o;
}

// Rows [r0, r0 + n) of the inputs on the device, sampled; outputs guarded.
SampleOut run_gpu(cuda::Context& ctx, const SampleInputs& in, int64_t r0, int64_t n, Checker& c) {
  const int64_t V = in.vocab;
  std::vector<float> l(in.logits.begin() + r0 * V, in.logits.begin() + (r0 + n) * V);
  std::vector<SampleAdjust> adj(in.adj.begin() + in.off[size_t(r0)], in.adj.begin() + in.off[size_t(r0 + n)]);
  std::vector<int64_t> off;
  for (int64_t r = r0; r <= r0 + n; ++r) off.push_back(in.off[size_t(r)] - in.off[size_t(r0)]);
  std::vector<SampleParams> p(in.params.begin() + r0, in.params.begin() + r0 + n);
  std::vector<uint32_t> m(in.mask.begin() + r0 * in.words, in.mask.begin() + (r0 + n) * in.words);
  cuda::DeviceBuffer dl = to_device(l), da = to_device(adj), doff = to_device(off), dp = to_device(p), dm = to_device(m);
  Guarded<int32_t> tok{size_t(n)}, st{size_t(n)};
  Guarded<float> lp{size_t(n)};
  const size_t nt = size_t(std::max<int64_t>(1, n * in.top_n));
  Guarded<int32_t> tid{nt};
  Guarded<float> tlp{nt};
  SampleArgs a;
  a.logits = dl.as<float>(), a.rows = n, a.vocab = V, a.params = dp.as<SampleParams>();
  a.adj = adj.empty() ? nullptr : da.as<SampleAdjust>();
  a.adj_offsets = adj.empty() ? nullptr : doff.as<int64_t>();
  a.mask = dm.as<uint32_t>(), a.mask_words = in.words;
  a.token = tok.ptr(), a.logprob = lp.ptr(), a.status = st.ptr();
  if (in.top_n > 0) a.top_n = in.top_n, a.top_id = tid.ptr(), a.top_logprob = tlp.ptr();
  sample_rows_cuda(ctx, a);
  ctx.sync();
  SampleOut o;
  o.token = tok.get(c, "token");
  o.status = st.get(c, "status");
  o.logprob = lp.get(c, "logprob");
  o.top_id = tid.get(c, "top_id");
  o.top_lp = tlp.get(c, "top_logprob");
  o.top_id.resize(size_t(n * in.top_n));
  o.top_lp.resize(size_t(n * in.top_n));
  o.logits = from_device<float>(dl, l.size());
  o.adj = from_device<SampleAdjust>(da, adj.size());
  return o;
}

std::unique_ptr<OpRun> sample_case(uint64_t seed, int64_t rows, int64_t vocab, int32_t top_n) {
  struct S {
    SampleInputs in;
    cuda::DeviceBuffer dl, da, doff, dp, dm, dt, ds, dlp, dtop;
  };
  auto st = std::make_shared<S>();
  st->in = make_inputs(seed, rows, vocab, top_n);
  // the timed call re-adjusts its logits in place each time: the same work, other values
  st->dl = to_device(st->in.logits);
  st->da = to_device(st->in.adj);
  st->doff = to_device(st->in.off);
  st->dp = to_device(st->in.params);
  st->dm = to_device(st->in.mask);
  st->dt = cuda::DeviceBuffer(size_t(rows) * 4);
  st->ds = cuda::DeviceBuffer(size_t(rows) * 4);
  st->dlp = cuda::DeviceBuffer(size_t(rows) * 4);
  st->dtop = cuda::DeviceBuffer(size_t(std::max<int64_t>(1, rows * top_n)) * 8);
  auto l = std::make_unique<SampleRun>();
  l->op = [st](cuda::Context& ctx) {
    SampleArgs a;
    a.logits = st->dl.as<float>(), a.rows = st->in.rows, a.vocab = st->in.vocab, a.params = st->dp.as<SampleParams>();
    a.adj = st->in.adj.empty() ? nullptr : st->da.as<SampleAdjust>();
    a.adj_offsets = st->in.adj.empty() ? nullptr : st->doff.as<int64_t>();
    a.mask = st->dm.as<uint32_t>(), a.mask_words = st->in.words;
    a.token = st->dt.as<int32_t>(), a.logprob = st->dlp.as<float>(), a.status = st->ds.as<int32_t>();
    if (st->in.top_n > 0)
      a.top_n = st->in.top_n, a.top_id = st->dtop.as<int32_t>(),
      a.top_logprob = reinterpret_cast<float*>(st->dtop.as<int32_t>() + st->in.rows * st->in.top_n);
    sample_rows_cuda(ctx, a);
  };
  l->chk = [st](cuda::Context& ctx, Checker& c) {
    const SampleInputs& in = st->in;
    const SampleOut ref = run_cpu(in);
    const SampleOut got = run_gpu(ctx, in, 0, in.rows, c);
    int64_t bad_tok = 0, ok_rows = 0;
    double lp_err = 0;
    for (int64_t r = 0; r < in.rows; ++r) {
      const size_t i = size_t(r);
      bad_tok += got.token[i] != ref.token[i] || got.status[i] != ref.status[i];
      if (ref.status[i] == kSampleOk) {
        ++ok_rows;
        lp_err = std::max(lp_err, double(std::fabs(got.logprob[i] - ref.logprob[i])));
      }
    }
    c.expect(bad_tok == 0, std::to_string(bad_tok) + " of " + std::to_string(in.rows) + " rows differ in token or status");
    c.err("logprob |gpu - cpu|", lp_err, 2e-5);
    // the raw top_n: the same ids in the same order, logprobs within the same bound (NaN where -1)
    int64_t bad_top = 0;
    double top_err = 0;
    for (size_t i = 0; i < ref.top_id.size(); ++i) {
      bad_top += got.top_id[i] != ref.top_id[i] || std::isnan(got.top_lp[i]) != std::isnan(ref.top_lp[i]);
      if (ref.top_id[i] >= 0) top_err = std::max(top_err, double(std::fabs(got.top_lp[i] - ref.top_lp[i])));
    }
    c.expect(bad_top == 0, std::to_string(bad_top) + " top entries differ in id");
    if (in.top_n > 0) c.err("top logprob |gpu - cpu|", top_err, 2e-5);
    c.expect(ok_rows > in.rows / 2, "too few rows sampled (" + std::to_string(ok_rows) + ")");
    // the adjusted logits and saved originals, bit for bit (rows the sampler reached)
    c.same_bits(got.logits.data(), ref.logits.data(), got.logits.size() * 4, "adjusted logits");
    if (!ref.adj.empty()) c.same_bits(got.adj.data(), ref.adj.data(), got.adj.size() * sizeof(SampleAdjust), "adjustments");
    // a row alone gives the bits it gets in the batch (first, middle, last)
    for (int64_t r : {int64_t(0), in.rows / 2, in.rows - 1}) {
      const SampleOut one = run_gpu(ctx, in, r, 1, c);
      c.expect(one.token[0] == got.token[size_t(r)] && one.status[0] == got.status[size_t(r)],
               "row " + std::to_string(r) + " alone draws another token than in the batch");
      c.same_bits(&one.logprob[0], &got.logprob[size_t(r)], 4, "row " + std::to_string(r) + " logprob alone");
      if (in.top_n > 0)
        c.same_bits(one.top_lp.data(), &got.top_lp[size_t(r * in.top_n)], size_t(in.top_n) * 4,
                    "row " + std::to_string(r) + " top logprobs alone");
    }
  };
  l->nbytes = double(rows * vocab) * 4;
  return l;
}

}  // namespace

void add_sample_cases(std::vector<OpCase>& out) {
  struct Shape {
    int64_t rows, vocab;
    int32_t top_n;
  };
  for (auto [rows, vocab, top_n] : {Shape{1, 129280, 0}, Shape{9, 1000, 0}, Shape{9, 129280, 0}, Shape{64, 129280, 0},
                                    Shape{256, 129280, 0}, Shape{18, 33, 0}, Shape{9, 129280, 20}, Shape{256, 129280, 5},
                                    Shape{18, 33, 20}, Shape{9, 7, 20}}) {
    OpCase c;
    c.family = "sample";
    c.shape = {{"rows", rows}, {"V", vocab}};
    if (top_n > 0) c.shape.push_back({"top", top_n});
    c.name = case_name("sample", c.shape);
    c.metric = "tokens exact, logprob |d|";
    c.tol = 2e-5;
    c.bench = vocab == 129280;
    c.make = [rows = rows, vocab = vocab, top_n = top_n](cuda::Context&, const MakeOptions& o) {
      return sample_case(o.seed, rows, vocab, top_n);
    };
    add_case(out, std::move(c));
  }
}

}  // namespace cm::optable
