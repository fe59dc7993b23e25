// The grouped MoE of the op table (moe_nvfp4, NVFP4 and MXFP4 experts): small
// and odd shapes with routing edge cases (ids outside the local range, every
// token on one expert, two experts, nothing routed), V4-Flash's expert shape
// (hidden 4096, intermediate 2048, top-6) with host experts, and the V4-Flash
// layer (256 device-generated experts, top-6 distinct) at 1 to 2048 tokens.
// Reference (host experts): per token, from linear_cpu,
//   h = bf16(silu(min(g, L)) * clamp(u, -L, L) * w_k),  y[t] = sum_k h . w2^T;
// metric ||y - ref|| / ||ref|| <= 1e-2 over the checked tokens, every output
// finite, canaries around y. Bit contracts (prefill cases): the prefill
// kernels give the decode kernels' bits, a second run and the automatic path
// the same bits, and a token's row does not depend on the batch (chunks of 7
// tokens, an uneven split).
#include <algorithm>
#include <memory>
#include <set>

#include "backend/cuda/moe/moe.h"
#include "bench/optable/op_case.h"
#include "bench/optable/op_util.h"
#include "tests/release_weights.h"

namespace cm::optable {
namespace {

enum class Experts { Nvfp4, Mxfp4, Device };  // host NVFP4, host MXFP4, device-generated NVFP4 (no reference)
enum class Route { Mod16, Range, One, Two, None, Distinct, Skewed };
const char* route_name(Route r) {
  switch (r) {
    case Route::Mod16: return "mod16";
    case Route::Range: return "range";
    case Route::One: return "one";
    case Route::Two: return "two";
    case Route::None: return "none";
    case Route::Distinct: return "distinct";
    case Route::Skewed: return "skewed";
  }
  return "?";
}
const char* path_name(cuda::MoePath p) {
  return p == cuda::MoePath::decode        ? "decode"
         : p == cuda::MoePath::prefill     ? "prefill"
         : p == cuda::MoePath::prefill_mma ? "prefillmma"
                                           : "auto";
}

struct Spec {
  Experts experts = Experts::Nvfp4;
  int64_t hidden = 256, inter = 128;
  int count = 8, first = 4, topk = 3;
  float limit = 1.0f;
  uint64_t wseed = 11;  // the experts' seed (fixed per expert set, as the inputs' seed varies)
  int T = 1;
  Route route = Route::Mod16;
  cuda::MoePath path = cuda::MoePath::automatic;
  bool bits = false;       // prefill vs decode kernels, rerun, automatic path: same bits
  bool invariant = false;  // chunks of 7 and an uneven split give the whole step's bits
  bool clamps = false;     // the inputs must reach the SwiGLU limit
  int ref_sample = 0;      // > 0: the reference on a sample of tokens only
};

struct HostExperts {
  std::vector<LinearWeight> w1, w3, w2;
};

std::vector<const LinearWeight*> ptrs(const std::vector<LinearWeight>& v) {
  std::vector<const LinearWeight*> p;
  for (auto& w : v) p.push_back(&w);
  return p;
}

std::vector<float> reference_token(const HostExperts& ex, int first, float limit, const float* xt, int64_t hidden,
                                   int64_t inter, const int32_t* ids_t, const float* wts_t, int topk, int64_t* clamped) {
  std::vector<float> y(static_cast<size_t>(hidden), 0.f), g(static_cast<size_t>(inter)), u(g), h(g),
      o(static_cast<size_t>(hidden));
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

std::vector<int32_t> make_ids(const Spec& s, Rng& r) {
  const int T = s.T, topk = s.topk;
  std::vector<int32_t> ids(size_t(T * topk));
  switch (s.route) {
    case Route::Mod16:  // global ids 0..15, local first..first+count: repeats, misses, empty experts
      for (auto& id : ids) id = int32_t(r.next() % 16);
      break;
    case Route::Range:  // [first - 2, first + count + 2): some outside the local range
      for (auto& id : ids) id = int32_t(s.first - 2 + int(r.next() % uint64_t(s.count + 4)));
      break;
    case Route::One:  // every token's first choice on expert 7, the others out of range or 11
      for (int t = 0; t < T; ++t) {
        ids[size_t(t * topk)] = 7;
        if (topk > 1) ids[size_t(t * topk + 1)] = 100;
        if (topk > 2) ids[size_t(t * topk + 2)] = t % 2 ? -1 : 11;
      }
      break;
    case Route::Two:  // two experts, repeated within tokens; the other local experts get no token
      for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(4 + (i * 7 / 5) % 2);
      break;
    case Route::None:  // nothing routed here
      std::fill(ids.begin(), ids.end(), 2);
      break;
    case Route::Distinct:
    case Route::Skewed:  // distinct experts per token as the router picks them; skewed: expert 37 in every top-k
      for (int t = 0; t < T; ++t)
        for (int k = 0; k < topk; ++k) {
          int32_t id;
          bool dup;
          do {
            id = (s.route == Route::Skewed && k == 0) ? 37 : int32_t(s.first + int(r.next() % uint64_t(s.count)));
            dup = false;
            for (int j = 0; j < k; ++j) dup |= ids[size_t(t * topk + j)] == id;
          } while (dup);
          ids[size_t(t * topk + k)] = id;
        }
      break;
  }
  return ids;
}

class MoeRun : public OpRun {
 public:
  MoeRun(const Spec& s, const MakeOptions& o) : s_(s) {
    if (s.experts == Experts::Device) {
      dex_ = cuda::random_experts(s.hidden, s.inter, s.first, s.count, s.wseed);
      dex_.swiglu_limit = s.limit;
    } else {
      for (int i = 0; i < s.count; ++i) {
        const uint64_t sd = s.wseed + 3 * uint64_t(i);
        if (s.experts == Experts::Mxfp4) {  // w1/w3 around 2^-9 .. 2^-5 per block, w2 a little smaller
          ex_.w1.push_back(testw::random_mxfp4(s.inter, s.hidden, sd, 118, 122));
          ex_.w3.push_back(testw::random_mxfp4(s.inter, s.hidden, sd + 1, 118, 122));
          ex_.w2.push_back(testw::random_mxfp4(s.hidden, s.inter, sd + 2, 117, 121));
        } else {
          ex_.w1.push_back(random_nvfp4(s.inter, s.hidden, sd, 0.02f));
          ex_.w3.push_back(random_nvfp4(s.inter, s.hidden, sd + 1, 0.02f));
          ex_.w2.push_back(random_nvfp4(s.hidden, s.inter, sd + 2, 0.01f));
        }
      }
      dex_ = cuda::upload_experts(ptrs(ex_.w1), ptrs(ex_.w3), ptrs(ex_.w2), s.first, s.limit);
    }
    scratch_ = std::make_unique<cuda::MoeScratch>(dex_, s.T, s.topk);
    Rng r(o.seed);
    // the bench: 8 routings, so the experts of a small step are not L2-resident
    const int routings = o.bench ? 8 : 1;
    double touched = 0;
    for (int i = 0; i < routings; ++i) {
      ids_.push_back(make_ids(s, r));
      std::vector<float> w(ids_.back().size());
      for (auto& v : w) v = 0.2f + r.uniform();
      wts_.push_back(w);
      std::set<int> distinct;
      for (int32_t id : ids_.back())
        if (id >= s.first && id < s.first + s.count) distinct.insert(id);
      touched += double(distinct.size()) / routings;
      dids_.push_back(to_device(ids_.back()));
      dw_.push_back(to_device(wts_.back()));
    }
    touched_ = touched;
    std::vector<uint16_t> xb;
    random_bf16(size_t(s.T * s.hidden), o.seed + 1, 1.0f, xb, xf_);
    dx_ = to_device(xb);
    y_ = cuda::DeviceBuffer(size_t(s.T * s.hidden) * 4);
  }

  int copies() const override { return int(ids_.size()); }
  double weight_bytes() const override { return touched_ * double(dex_.expert_bytes()); }
  double bytes() const override { return weight_bytes() + double(s_.T) * double(s_.hidden) * (2 + 4); }
  double flops() const override { return 2.0 * 3 * double(s_.T) * s_.topk * double(s_.hidden * s_.inter); }
  std::string path() const override {
    const bool mma = s_.path == cuda::MoePath::prefill_mma;
    const bool prefill = s_.path == cuda::MoePath::prefill || mma ||
                         (s_.path == cuda::MoePath::automatic && s_.T >= cuda::kMoePrefillMinTokens);
    return std::string(!prefill ? "route + gate/up + down"
                       : mma    ? "route + mma.sync prefill gate/up + down"
                                : "route + wgmma prefill gate/up + down") +
           " (" +
           std::to_string(int64_t(touched_ + 0.5)) + " experts touched)";
  }

  void run(cuda::Context& ctx, int i) override {
    cuda::moe_nvfp4(ctx, dex_, *scratch_, dx_.as<const uint16_t>(), s_.T, dids_[size_t(i)].as<const int32_t>(),
                    dw_[size_t(i)].as<const float>(), y_.as<float>(), s_.path);
  }

  void check(cuda::Context& ctx, Checker& c) override {
    const int T = s_.T;
    const std::vector<float> y = call(ctx, c, 0, T, s_.path);
    if (s_.route == Route::None) {
      int64_t nonzero = 0;
      for (float v : y) nonzero += v != 0.0f;
      c.expect(nonzero == 0, std::to_string(nonzero) + " outputs not exactly zero with nothing routed here");
    } else if (s_.experts != Experts::Device) {
      std::vector<int> toks;
      if (s_.ref_sample > 0) {
        toks = {0, 1, 33, T / 2, T - 2, T - 1};
        toks.erase(std::remove_if(toks.begin(), toks.end(), [&](int t) { return t < 0 || t >= T; }), toks.end());
        std::sort(toks.begin(), toks.end());
        toks.erase(std::unique(toks.begin(), toks.end()), toks.end());
      } else {
        for (int t = 0; t < T; ++t) toks.push_back(t);
      }
      std::vector<float> got, ref;
      int64_t clamped = 0;
      for (int t : toks) {
        const std::vector<float> rt =
            reference_token(ex_, dex_.first, dex_.swiglu_limit, &xf_[size_t(t * s_.hidden)], s_.hidden, s_.inter,
                            &ids_[0][size_t(t * s_.topk)], &wts_[0][size_t(t * s_.topk)], s_.topk, &clamped);
        ref.insert(ref.end(), rt.begin(), rt.end());
        got.insert(got.end(), y.begin() + int64_t(t) * s_.hidden, y.begin() + int64_t(t + 1) * s_.hidden);
      }
      int64_t nonfinite = 0;
      const double e = rel_error(got, ref, &nonfinite);
      c.expect(nonfinite == 0, std::to_string(nonfinite) + " non-finite outputs");
      c.err(std::string("||y-ref||/||ref||") + (s_.ref_sample > 0 ? " (sampled tokens)" : ""), e, 1e-2);
      if (s_.clamps) c.expect(clamped > 0, "the inputs never reach the SwiGLU limit");
    }
    if (s_.bits) {
      const std::vector<float> pf = s_.path == cuda::MoePath::prefill ? y : call(ctx, c, 0, T, cuda::MoePath::prefill);
      const size_t n = pf.size() * 4;
      c.same_bits(pf.data(), call(ctx, c, 0, T, cuda::MoePath::decode).data(), n, "prefill vs decode kernels");
      c.same_bits(pf.data(), call(ctx, c, 0, T, cuda::MoePath::prefill_mma).data(), n,
                  "prefill vs the mma.sync prefill kernels");
      c.same_bits(pf.data(), call(ctx, c, 0, T, cuda::MoePath::prefill).data(), n, "prefill vs a second prefill");
      c.same_bits(pf.data(), call(ctx, c, 0, T, cuda::MoePath::automatic).data(), n, "prefill vs the automatic path");
    }
    if (s_.invariant) {
      const std::vector<float> whole = call(ctx, c, 0, T, cuda::MoePath::prefill);
      std::vector<float> by7, split;
      for (int t0 = 0; t0 < T; t0 += 7) {
        const std::vector<float> part = call(ctx, c, t0, std::min(7, T - t0), cuda::MoePath::automatic);
        by7.insert(by7.end(), part.begin(), part.end());
      }
      c.same_bits(by7.data(), whole.data(), whole.size() * 4, "chunks of 7 tokens (decode kernels) vs one prefill");
      const int cut = std::max(1, T / 3 + 5);
      for (auto [t0, n] : {std::pair{0, cut}, std::pair{cut, T - cut}}) {
        if (n <= 0) continue;
        const std::vector<float> part = call(ctx, c, t0, n, cuda::MoePath::prefill);
        split.insert(split.end(), part.begin(), part.end());
      }
      c.same_bits(split.data(), whole.data(), whole.size() * 4, "prefill split at token " + std::to_string(cut));
    }
  }

 private:
  // y of tokens [t0, t0 + n) in one call on `path`, into a guarded output.
  std::vector<float> call(cuda::Context& ctx, Checker& c, int t0, int n, cuda::MoePath path) {
    Guarded<float> y(size_t(n) * size_t(s_.hidden));
    cuda::moe_nvfp4(ctx, dex_, *scratch_, dx_.as<const uint16_t>() + int64_t(t0) * s_.hidden, n,
                    dids_[0].as<const int32_t>() + int64_t(t0) * s_.topk, dw_[0].as<const float>() + int64_t(t0) * s_.topk,
                    y.ptr(), path);
    ctx.sync();
    return y.get(c, std::string("y (") + path_name(path) + ")");
  }

  Spec s_;
  HostExperts ex_;
  cuda::DeviceExperts dex_;
  std::unique_ptr<cuda::MoeScratch> scratch_;
  std::vector<std::vector<int32_t>> ids_;
  std::vector<std::vector<float>> wts_;
  std::vector<cuda::DeviceBuffer> dids_, dw_;
  std::vector<float> xf_;
  cuda::DeviceBuffer dx_, y_;
  double touched_ = 0;
};

void add(std::vector<OpCase>& out, const Spec& s, bool bench = false, bool huge = false) {
  OpCase c;
  c.family = s.experts == Experts::Mxfp4 ? "moe_mxfp4" : "moe_nvfp4";
  c.shape = {{"hidden", s.hidden}, {"inter", s.inter}, {"E", s.count}, {"first", s.first},
             {"topk", s.topk},     {"T", s.T}};
  c.name = case_name(c.family, c.shape,
                     std::string(route_name(s.route)) + "_" + path_name(s.path) +
                         (s.experts == Experts::Device ? "_dev" : "") + (s.bits ? "_bits" : "") +
                         (s.invariant ? "_inv" : ""));
  c.metric = s.experts == Experts::Device ? "bits (prefill vs decode kernels)" : "||y-ref||/||ref||";
  c.tol = s.experts == Experts::Device ? 0 : 1e-2;
  c.bench = bench;
  c.huge = huge;
  c.make = [s](cuda::Context&, const MakeOptions& o) { return std::make_unique<MoeRun>(s, o); };
  add_case(out, std::move(c));
}

// The top-k sum runs in a fixed order (no float atomics): the same step three times gives the same bits.
void same_inputs_same_bits(cuda::Context& ctx, Checker& c) {
  const int64_t hidden = 512, inter = 256;
  const int count = 8, topk = 6, T = 64;
  HostExperts ex;
  for (int i = 0; i < count; ++i) {
    ex.w1.push_back(random_nvfp4(inter, hidden, 41 + 3 * uint64_t(i), 0.02f));
    ex.w3.push_back(random_nvfp4(inter, hidden, 42 + 3 * uint64_t(i), 0.02f));
    ex.w2.push_back(random_nvfp4(hidden, inter, 43 + 3 * uint64_t(i), 0.01f));
  }
  cuda::DeviceExperts dex = cuda::upload_experts(ptrs(ex.w1), ptrs(ex.w3), ptrs(ex.w2), 0, 10.0f);
  Rng r(42);
  std::vector<int32_t> ids(size_t(T * topk));
  for (int t = 0; t < T; ++t)  // distinct experts per token, some outside the local range
    for (int k = 0; k < topk; ++k) ids[size_t(t * topk + k)] = int32_t((t + 3 * k) % (count + 2));
  std::vector<float> wts(ids.size());
  for (auto& w : wts) w = 0.2f + r.uniform();
  std::vector<uint16_t> xb;
  std::vector<float> xf;
  random_bf16(size_t(T * hidden), 43, 1.0f, xb, xf);
  cuda::MoeScratch scratch(dex, T, topk);
  cuda::DeviceBuffer dx = to_device(xb), dids = to_device(ids), dw = to_device(wts), dy(size_t(T * hidden) * 4);
  std::vector<float> first;
  for (int run = 0; run < 3; ++run) {
    cuda::moe_nvfp4(ctx, dex, scratch, dx.as<const uint16_t>(), T, dids.as<const int32_t>(), dw.as<const float>(),
                    dy.as<float>());
    ctx.sync();
    const std::vector<float> y = from_device<float>(dy, size_t(T * hidden));
    if (run == 0) first = y;
    else c.same_bits(first.data(), y.data(), y.size() * 4, "run " + std::to_string(run) + " vs run 0");
  }
}

}  // namespace

void add_moe_cases(std::vector<OpCase>& out) {
  // ---- decode path (automatic), small shapes, limit 1.0 so the clamps are exercised ----
  Spec s;
  for (int T : {1, 2, 5, 17, 40}) {
    s.T = T;
    s.clamps = T >= 5;
    add(out, s);
  }
  s.clamps = false;
  s.T = 40;
  s.route = Route::One;
  add(out, s);
  s.T = 6;
  s.route = Route::None;
  add(out, s);
  // V4-Flash's expert shape, 8 host experts
  Spec f;
  f.hidden = 4096;
  f.inter = 2048;
  f.count = 8;
  f.first = 16;
  f.topk = 6;
  f.limit = 10.0f;
  f.wseed = 21;
  f.route = Route::Range;
  for (int T : {1, 4}) {
    f.T = T;
    add(out, f);
  }
  {
    OpCase c;
    c.family = "moe_nvfp4";
    c.name = "moe_nvfp4_same_inputs_same_bits";
    c.metric = "bits";
    c.check_only = true;
    c.bench = false;
    c.make = [](cuda::Context&, const MakeOptions&) { return check_only_run(same_inputs_same_bits); };
    add_case(out, std::move(c));
  }
  // ---- prefill kernels: reference, decode bits, rerun, automatic path; small and odd shapes (K chunks not a
  // multiple of 4), token counts around the 64-token tile, routing edge cases ----
  for (auto [hidden, inter] : {std::pair<int64_t, int64_t>{256, 128}, std::pair<int64_t, int64_t>{320, 192}}) {
    Spec p;
    p.hidden = hidden;
    p.inter = inter;
    p.wseed = 51 + uint64_t(hidden);
    p.path = cuda::MoePath::prefill;
    p.bits = true;
    for (int T : {1, 7, 64, 65, 200}) {
      p.T = T;
      add(out, p);
    }
    p.T = 200;
    p.route = Route::One;  // tiles of 64, 64, 64, 8 on expert 7
    p.invariant = true;
    add(out, p);
    p.invariant = false;
    p.T = 130;
    p.route = Route::Two;
    add(out, p);
    p.T = 70;
    p.route = Route::None;
    add(out, p);
  }
  // V4-Flash's expert shape with host experts: the reference on sampled tokens, decode bits on all
  Spec fp = f;
  fp.wseed = 61;
  fp.path = cuda::MoePath::prefill;
  fp.bits = true;
  fp.ref_sample = 6;
  for (int T : {64, 512}) {
    fp.T = T;
    add(out, fp);
  }
  // The V4-Flash layer: 256 device-generated experts, top-6 distinct; prefill = decode bits, uniform and skewed
  Spec L;
  L.experts = Experts::Device;
  L.hidden = 4096;
  L.inter = 2048;
  L.count = 256;
  L.first = 0;
  L.topk = 6;
  L.limit = 10.0f;
  L.wseed = 71;
  L.path = cuda::MoePath::prefill;
  L.bits = true;
  for (int T : {64, 512, 2048})
    for (Route r : {Route::Distinct, Route::Skewed}) {
      L.T = T;
      L.route = r;
      L.invariant = T == 512 && r == Route::Distinct;
      add(out, L, false, T == 2048);
    }
  // the bench: the layer at 1, 16, 256 tokens on both kernel families (kMoePrefillMinTokens is a speed choice
  // only: same bits), checked as prefill vs decode bits
  L.invariant = false;
  L.route = Route::Distinct;
  for (int T : {1, 16, 256})
    for (cuda::MoePath p : {cuda::MoePath::decode, cuda::MoePath::prefill, cuda::MoePath::prefill_mma}) {
      L.T = T;
      L.path = p;
      add(out, L, true);
    }
  // the prefill kernels at prefill sizes (bench only: the bits are checked above)
  for (int T : {2048, 8192})
    for (cuda::MoePath p : {cuda::MoePath::prefill, cuda::MoePath::prefill_mma}) {
      L.T = T;
      L.path = p;
      L.bits = false;
      add(out, L, true, true);
    }
  L.bits = true;
  // ---- MXFP4 experts (the release format, repacked): automatic path and the prefill kernels ----
  Spec m;
  m.experts = Experts::Mxfp4;
  m.wseed = 31;
  m.route = Route::Range;
  for (cuda::MoePath p : {cuda::MoePath::automatic, cuda::MoePath::prefill}) {
    m.path = p;
    for (int T : {1, 2, 5, 17, 40, 100}) {
      m.T = T;
      add(out, m);
    }
  }
  Spec mf = f;
  mf.experts = Experts::Mxfp4;
  mf.wseed = 41;
  for (cuda::MoePath p : {cuda::MoePath::automatic, cuda::MoePath::prefill}) {
    mf.path = p;
    for (int T : {1, 4, 16}) {
      mf.T = T;
      add(out, mf);
    }
  }
}

}  // namespace cm::optable
