// The quantized linears of the op table: NVFP4 (linear_nvfp4 and its forced
// kernels), MXFP4 (the same kernels after the host repack) and FP8 128x128
// blocks (linear_fp8), on V4-Flash's shapes (expert w1/w3 4096->2048 and w2,
// attention wq_a, wq_b, wkv, grouped wo_a 8 x 4096->1024, wo_b, the head
// 4096->129280) and odd ones (N not a multiple of 16, K not a multiple of 64
// or 128, grouped, many row blocks), M from 1 to 4096.
// Metric: ||y - ref|| / ||ref|| against linear_cpu (src/ops/linear.cpp), F32
// output <= 1e-5 (exact products, only the fp32 summation order differs),
// BF16 output <= 1e-2 (one bf16 rounding of each output); every output
// finite; canaries before, after and between the output rows. The reference
// covers every row up to M·N·K = 2^34 (and M <= 1000 for the bit-checked
// prefill kernels), else a sample of rows (first, last, tile edges). The prefill kernels that promise the decode kernel's bits
// (NVFP4 mma.sync tiles, FP8 Exact prefill) are also compared bit for bit with
// the decode kernel over 32-row slices (every row) and with the decode kernel
// on single rows (the sample): batch invariance.
#include <algorithm>
#include <limits>
#include <memory>

#include "backend/cuda/device_model.h"
#include "backend/cuda/linear/linear.h"
#include "backend/cuda/linear/nvfp4_pack.h"
#include "bench/optable/op_case.h"
#include "bench/optable/op_util.h"
#include "common/error.h"
#include "tests/release_weights.h"

namespace cm::optable {
namespace {

using testw::Fp8Scales;

constexpr int64_t kSlices = std::numeric_limits<int64_t>::max();  // decode_max_m: the decode kernel at any M

enum class Fmt { NVFP4, MXFP4, FP8 };
// Which kernel serves the call. NVFP4/MXFP4: Auto (decode_max_m 64, the default prefill), Wgmma / Cublas
// (forced above 64 rows), WgmmaAll (the wgmma kernel from one row), Tiles (the mma.sync prefill kernel,
// decode bits), Slices (the decode kernel in 32-row slices), XWgmma (the wgmma kernel with decode bits).
// FP8: Auto, Slices, Exact (the prefill kernel).
enum class Var { Auto, Wgmma, Cublas, WgmmaAll, Tiles, Slices, Exact, XWgmma };
const char* var_name(Var v) {
  switch (v) {
    case Var::Auto: return "auto";
    case Var::Wgmma: return "wgmma";
    case Var::Cublas: return "cublas";
    case Var::WgmmaAll: return "wgmmaall";
    case Var::Tiles: return "tiles";
    case Var::Slices: return "slices";
    case Var::Exact: return "exact";
    case Var::XWgmma: return "xwgmma";
  }
  return "?";
}

struct Spec {
  Fmt fmt = Fmt::NVFP4;
  int64_t N = 0, K = 0, M = 0;
  int G = 1;
  Var var = Var::Auto;
  Fp8Scales scales = Fp8Scales::E8M0;  // FP8
  int e_lo = 118, e_hi = 126;          // MXFP4 exponent range
};

const char* expected_fp8_path(int64_t M, Fp8Scales s) {
  if (M <= 64) return cuda::kFp8PathDecode;
  return s == Fp8Scales::F32_ANY ? cuda::kFp8PathSlices : cuda::kFp8PathCublas;
}

// Group g's rows [g*N/G, (g+1)*N/G) read x[:, g*K:(g+1)*K] (x is [M, G*K]).
std::vector<float> reference_linear(const LinearWeight& w, int groups, const std::vector<float>& x, int64_t M) {
  const int64_t N = w.out_features, K = w.in_features, ng = N / groups;
  std::vector<float> y(size_t(M * N)), xs(size_t(M * K)), ys(size_t(M * ng));
  for (int g = 0; g < groups; ++g) {
    for (int64_t m = 0; m < M; ++m) std::memcpy(&xs[size_t(m * K)], &x[size_t(m * groups * K + g * K)], size_t(K) * 4);
    linear_cpu_rows(w, g * ng, ng, xs.data(), M, ys.data());
    for (int64_t m = 0; m < M; ++m) std::memcpy(&y[size_t(m * N + g * ng)], &ys[size_t(m * ng)], size_t(ng) * 4);
  }
  return y;
}

// The rows sampled for the reference of large calls and for the single-row bit checks.
std::vector<int64_t> sample_rows(int64_t M) {
  std::vector<int64_t> r = {0, 1, 7, 8, 31, 32, 63, M - 1, M / 3 + 1};
  if (M > 64) r.insert(r.end(), {64, 65, M / 2, M - 2});
  std::vector<int64_t> out;
  for (int64_t m : r)
    if (m >= 0 && m < M) out.push_back(m);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

class LinearRun : public OpRun {
 public:
  LinearRun(const Spec& s, const MakeOptions& o) : s_(s) {
    const uint64_t seed = o.seed;
    const int64_t KX = s.K * s.G;
    if (s.fmt == Fmt::FP8) {
      w_ = testw::random_fp8(s.N, s.K, seed, s.scales);
      f8_.push_back(cuda::upload_fp8(w_, s.G));
    } else {
      w_ = s.fmt == Fmt::MXFP4 ? testw::random_mxfp4(s.N, s.K, seed, s.e_lo, s.e_hi) : random_nvfp4(s.N, s.K, seed);
      f4_.push_back(cuda::upload_nvfp4(w_, s.G));
    }
    std::vector<uint16_t> xb;
    random_bf16(size_t(s.M * KX), seed * 31 + uint64_t(s.M), 2.0f, xb, xf_);
    x_ = to_device(xb);
    if (o.bench) {
      const int copies = rotation_copies(weight_bytes());
      for (int i = 1; i < copies; ++i) {
        if (s.fmt == Fmt::FP8) f8_.push_back(clone_fp8(f8_[0]));
        else f4_.push_back(clone_fp4(f4_[0]));
      }
      y_ = cuda::DeviceBuffer(size_t(s.M * s.N) * 2);
      w_ = LinearWeight{};  // the host weight is not needed for timing
      xf_.clear();
    }
  }

  int copies() const override { return int(s_.fmt == Fmt::FP8 ? f8_.size() : f4_.size()); }
  double weight_bytes() const override {
    return double(s_.fmt == Fmt::FP8 ? f8_[0].device_bytes() : f4_[0].device_bytes());
  }
  double bytes() const override { return weight_bytes() + double(s_.M * s_.K * s_.G) * 2 + double(s_.M * s_.N) * 2; }
  double flops() const override { return 2.0 * double(s_.M) * double(s_.N) * double(s_.K); }
  std::string path() const override { return path_; }

  void run(cuda::Context& ctx, int i) override { call(ctx, size_t(i), s_.var, 0, s_.M, y_.get(), s_.N, cuda::OutType::BF16); }

  void check(cuda::Context& ctx, Checker& c) override {
    const int64_t M = s_.M, N = s_.N, KX = s_.K * s_.G;
    // device bytes: the stored size up to padding of N to 16 and K to 64
    if (s_.fmt == Fmt::FP8) {
      const int64_t padded = (N + 15) / 16 * 16 * ((s_.K + 63) / 64 * 64);
      c.expect(f8_[0].pow2_scales == (s_.scales != Fp8Scales::F32_ANY), "pow2_scales flag");
      c.expect(int64_t(f8_[0].data.size()) == padded, "fp8 data bytes " + std::to_string(f8_[0].data.size()));
      c.expect(int64_t(f8_[0].scales.size()) == (N + 127) / 128 * ((s_.K + 127) / 128) * 4, "fp8 scale bytes");
    } else if (s_.fmt == Fmt::NVFP4) {
      const double stored = double(N * s_.K) / 2 + double(N * s_.K) / 16;
      const double padded = double((N + 15) / 16 * 16) * double((s_.K + 63) / 64 * 64) * (0.5 + 1.0 / 16);
      const double have = double(f4_[0].device_bytes());
      c.expect(have <= padded + 1 && have >= stored, "nvfp4 device bytes " + std::to_string(have));
    }
    // the reference: every row, or a sample of rows for large calls
    const bool bits = s_.var == Var::Tiles || s_.var == Var::Exact || s_.var == Var::XWgmma;
    const bool all_rows = double(M) * double(N) * double(s_.K) <= double(int64_t(1) << 34) && !(bits && M > 1000);
    const std::vector<int64_t> sample = sample_rows(M);
    std::vector<float> ref;
    if (all_rows) {
      ref = reference_linear(w_, s_.G, xf_, M);
    } else {
      std::vector<float> xs(sample.size() * size_t(KX));
      for (size_t i = 0; i < sample.size(); ++i)
        std::memcpy(&xs[i * size_t(KX)], &xf_[size_t(sample[i] * KX)], size_t(KX) * 4);
      ref = reference_linear(w_, s_.G, xs, int64_t(sample.size()));
    }
    for (cuda::OutType ot : {cuda::OutType::F32, cuda::OutType::BF16}) {
      const bool f32 = ot == cuda::OutType::F32;
      const std::string tag = f32 ? "f32" : "bf16";
      const size_t es = f32 ? 4 : 2;
      GuardedRows g(M, N, es);
      call(ctx, 0, s_.var, 0, M, g.ptr(), g.ld(), ot);
      const std::vector<uint8_t> raw = g.raw(c, tag + " output");
      const std::vector<float> all = g.widen(raw);
      int64_t nonfinite = 0;
      for (float v : all) nonfinite += !std::isfinite(v);
      c.expect(nonfinite == 0, tag + ": " + std::to_string(nonfinite) + " non-finite outputs");
      std::vector<float> got;
      if (all_rows) {
        got = all;
      } else {
        for (int64_t m : sample) got.insert(got.end(), all.begin() + m * N, all.begin() + (m + 1) * N);
      }
      c.err(tag + " ||y-ref||/||ref||" + (all_rows ? "" : " (sampled rows)"), rel_error(got, ref), f32 ? 1e-5 : 1e-2);
      if (s_.fmt == Fmt::FP8 && s_.var == Var::Auto)
        c.expect(path_ == expected_fp8_path(M, s_.scales), "path " + path_ + ", expected " + expected_fp8_path(M, s_.scales));
      if (s_.fmt == Fmt::FP8 && s_.var == Var::Exact) {
        const bool wg = M >= cuda::kFp8ExactWgmmaMinRows && !cuda::exact_wgmma_fp8_unsupported(ctx, f8_[0], M);
        c.expect(path_ == (wg ? cuda::kFp8PathExactWgmma : cuda::kFp8PathPrefill), "path " + path_);
      }
      if (!bits) continue;
      // batch invariance: the prefill kernel gives the decode kernel's bits, in slices and on single rows
      GuardedRows d(M, N, es);
      call(ctx, 0, Var::Slices, 0, M, d.ptr(), d.ld(), ot);
      if (s_.fmt == Fmt::FP8) c.expect(path_ == cuda::kFp8PathDecode, "slices path " + path_);
      const std::vector<uint8_t> dec = d.raw(c, tag + " decode slices");
      c.same_bits(raw.data(), dec.data(), raw.size(), tag + " prefill kernel vs decode slices");
      for (int64_t m : sample) {
        GuardedRows one(1, N, es);
        call(ctx, 0, Var::Slices, m, 1, one.ptr(), one.ld(), ot);
        const std::vector<uint8_t> r1 = one.raw(c, tag + " single row");
        c.same_bits(r1.data(), raw.data() + size_t(m * N) * es, r1.size(),
                    tag + " row " + std::to_string(m) + " alone (decode) vs the prefill kernel's row");
      }
    }
  }

 private:
  // Runs variant v on rows [m0, m0 + rows) of x into y (row stride ldy).
  void call(cuda::Context& ctx, size_t i, Var v, int64_t m0, int64_t rows, void* y, int64_t ldy, cuda::OutType ot) {
    const int64_t KX = s_.K * s_.G;
    const uint16_t* x = x_.as<const uint16_t>() + m0 * KX;
    if (s_.fmt == Fmt::FP8) {
      int64_t dmax = 64;
      cuda::Fp8Prefill pf = cuda::Fp8Prefill::Fast;
      if (v == Var::Slices) dmax = kSlices;
      if (v == Var::Exact) {
        dmax = 0;
        pf = cuda::Fp8Prefill::Exact;
      }
      if (v == Var::XWgmma) {
        cuda::linear_fp8_exact_wgmma(ctx, f8_[i], x, rows, KX, y, ldy, ot);
        path_ = cuda::kFp8PathExactWgmma;
        return;
      }
      path_ = cuda::linear_fp8(ctx, f8_[i], x, rows, KX, y, ldy, ot, dmax, pf);
      return;
    }
    const cuda::DeviceLinear& w = f4_[i];
    if (v == Var::Tiles) {
      cuda::linear_nvfp4_tiles(ctx, w, x, rows, KX, y, ldy, ot);
      path_ = "mma.sync prefill";
      return;
    }
    if (v == Var::XWgmma) {
      cuda::linear_nvfp4_exact_wgmma(ctx, w, x, rows, KX, y, ldy, ot);
      path_ = "wgmma exact";
      return;
    }
    int64_t dmax = 64;
    cuda::PrefillKernel pk = cuda::PrefillKernel::Auto;
    if (v == Var::Wgmma) pk = cuda::PrefillKernel::Wgmma;
    if (v == Var::Cublas) pk = cuda::PrefillKernel::DequantCublas;
    if (v == Var::WgmmaAll) {
      pk = cuda::PrefillKernel::Wgmma;
      dmax = 0;
    }
    if (v == Var::Slices) dmax = kSlices;
    path_ = cuda::linear_nvfp4_path(w, rows, dmax, pk);
    cuda::linear_nvfp4(ctx, w, x, rows, KX, y, ldy, ot, dmax, pk);
  }

  static cuda::DeviceLinear clone_fp4(const cuda::DeviceLinear& o) {
    cuda::DeviceLinear c;
    c.name = o.name;
    c.N = o.N;
    c.K = o.K;
    c.row_blocks = o.row_blocks;
    c.chunks = o.chunks;
    c.groups = o.groups;
    c.scale_2 = o.scale_2;
    c.data = clone(o.data);
    c.scales = clone(o.scales);
    return c;
  }
  static cuda::DeviceFp8Linear clone_fp8(const cuda::DeviceFp8Linear& o) {
    cuda::DeviceFp8Linear c;
    c.name = o.name;
    c.N = o.N;
    c.K = o.K;
    c.row_blocks = o.row_blocks;
    c.chunks = o.chunks;
    c.groups = o.groups;
    c.scale_rows = o.scale_rows;
    c.scale_cols = o.scale_cols;
    c.pow2_scales = o.pow2_scales;
    c.data = clone(o.data);
    c.scales = clone(o.scales);
    return c;
  }

  Spec s_;
  LinearWeight w_;
  std::vector<float> xf_;
  std::vector<cuda::DeviceLinear> f4_;
  std::vector<cuda::DeviceFp8Linear> f8_;
  cuda::DeviceBuffer x_, y_;
  std::string path_;
};

struct Shape {
  int64_t N, K;
  int G;
};

OpCase linear_case(const Spec& s, bool bench, bool huge = false) {
  OpCase c;
  c.family = s.fmt == Fmt::FP8 ? "linear_fp8" : s.fmt == Fmt::MXFP4 ? "linear_mxfp4" : "linear_nvfp4";
  c.shape = {{"N", s.N}, {"K", s.K}, {"G", s.G}, {"M", s.M}};
  if (s.fmt == Fmt::FP8) c.shape.push_back({"scales", int64_t(s.scales)});
  if (s.fmt == Fmt::MXFP4) {
    c.shape.push_back({"elo", s.e_lo});
    c.shape.push_back({"ehi", s.e_hi});
  }
  c.name = case_name(c.family, c.shape, var_name(s.var));
  c.metric = "||y-ref||/||ref|| (f32 and bf16 outputs)";
  c.tol = 1e-2;
  c.bench = bench;
  c.huge = huge;
  c.make = [s](cuda::Context&, const MakeOptions& o) { return std::make_unique<LinearRun>(s, o); };
  return c;
}

void grid(std::vector<OpCase>& out, Spec s, const std::vector<Shape>& shapes, const std::vector<int64_t>& ms,
          bool bench = false, bool huge = false) {
  for (const Shape& sh : shapes)
    for (int64_t M : ms) {
      s.N = sh.N;
      s.K = sh.K;
      s.G = sh.G;
      s.M = M;
      add_case(out, linear_case(s, bench, huge));
    }
}

// ---- check-only cases ----

// A row gets the same bits from the NVFP4 decode kernel in launches of 1 (MT 1), 12 (MT 2), 20 (MT 4) and
// as the last row of a 33-row call (a second slice of one row).
void decode_invariance(cuda::Context& ctx, Checker& c, Shape s) {
  const int64_t KX = s.K * s.G, M = 33;
  LinearWeight w = random_nvfp4(s.N, s.K, uint64_t(s.N + s.K));
  cuda::DeviceLinear dw = cuda::upload_nvfp4(w, s.G);
  std::vector<uint16_t> xb;
  std::vector<float> xf;
  random_bf16(size_t(M * KX), 5, 2.0f, xb, xf);
  cuda::DeviceBuffer dx = to_device(xb);
  for (cuda::OutType ot : {cuda::OutType::F32, cuda::OutType::BF16}) {
    const size_t es = ot == cuda::OutType::F32 ? 4 : 2, row = size_t(s.N) * es;
    auto call = [&](int64_t m0, int64_t rows) {
      GuardedRows g(rows, s.N, es);
      cuda::linear_nvfp4(ctx, dw, dx.as<const uint16_t>() + m0 * KX, rows, KX, g.ptr(), g.ld(), ot, kSlices);
      return g.raw(c);
    };
    const std::vector<uint8_t> all = call(0, M), mt2 = call(0, 12), mt4 = call(0, 20), last = call(M - 1, 1);
    for (int64_t m : {int64_t(0), int64_t(11)}) {
      const std::vector<uint8_t> one = call(m, 1);
      c.same_bits(one.data(), &all[size_t(m) * row], row, "row " + std::to_string(m) + " alone vs in 33 rows");
      c.same_bits(one.data(), &mt2[size_t(m) * row], row, "row " + std::to_string(m) + " alone vs in 12 rows");
      c.same_bits(one.data(), &mt4[size_t(m) * row], row, "row " + std::to_string(m) + " alone vs in 20 rows");
    }
    c.same_bits(last.data(), &all[size_t(M - 1) * row], row, "row 32 alone vs in 33 rows");
  }
}

// Back-to-back NVFP4 decode linears, the second reading the first's output (NaN before each round): with
// programmatic dependent launch the second must wait for the first (griddepcontrol.wait).
void chained_decode(Checker& c, bool pdl) {
  cuda::Context ctx(0, pdl);
  const int64_t M = 5, K1 = 4096, N1 = 2048, N2 = 4096;
  LinearWeight w1 = random_nvfp4(N1, K1, 71), w2 = random_nvfp4(N2, N1, 72);
  cuda::DeviceLinear d1 = cuda::upload_nvfp4(w1), d2 = cuda::upload_nvfp4(w2);
  std::vector<uint16_t> xb;
  std::vector<float> xf;
  random_bf16(size_t(M * K1), 73, 2.0f, xb, xf);
  std::vector<float> h(size_t(M * N1)), ref(size_t(M * N2));
  linear_cpu(w1, xf.data(), M, h.data());
  for (float& v : h) v = bf16_to_f32(f32_to_bf16(v));
  linear_cpu(w2, h.data(), M, ref.data());
  cuda::DeviceBuffer dx = to_device(xb), dh(h.size() * 2), dy(ref.size() * 4);
  for (int round = 0; round < 20; ++round) {
    CM_CUDA(cudaMemsetAsync(dh.get(), 0xFF, dh.size(), ctx.stream()));  // bf16 NaN
    cuda::linear_nvfp4(ctx, d1, dx.as<const uint16_t>(), M, K1, dh.get(), N1, cuda::OutType::BF16);
    cuda::linear_nvfp4(ctx, d2, dh.as<const uint16_t>(), M, N1, dy.get(), N2, cuda::OutType::F32);
    ctx.sync();
    const std::vector<float> y = from_device<float>(dy, ref.size());
    int64_t nonfinite = 0;
    // h is rounded to bf16 on both sides; the fp32 sums before that rounding may differ in the last bit
    const double e = rel_error(y, ref, &nonfinite);
    if (nonfinite || e > 2e-3) {
      c.err("round " + std::to_string(round) + " ||y-ref||/||ref||", nonfinite ? INFINITY : e, 2e-3);
      return;
    }
  }
  c.err("20 rounds ||y-ref||/||ref||", 0, 2e-3);
}

// The same chain through the mma.sync prefill kernel (300 rows): the decode chain's bits every round.
void chained_tiles(Checker& c, bool pdl) {
  const int64_t M = 300, K1 = 4096, N1 = 2048, N2 = 4096;
  LinearWeight w1 = random_nvfp4(N1, K1, 81), w2 = random_nvfp4(N2, N1, 82);
  std::vector<uint16_t> xb;
  std::vector<float> xf;
  random_bf16(size_t(M * K1), 83, 2.0f, xb, xf);
  cuda::Context ctx(0, pdl);
  cuda::DeviceLinear d1 = cuda::upload_nvfp4(w1), d2 = cuda::upload_nvfp4(w2);
  cuda::DeviceBuffer dx = to_device(xb), dh(size_t(M * N1) * 2), dy(size_t(M * N2) * 4);
  cuda::linear_nvfp4(ctx, d1, dx.as<const uint16_t>(), M, K1, dh.get(), N1, cuda::OutType::BF16, kSlices);
  cuda::linear_nvfp4(ctx, d2, dh.as<const uint16_t>(), M, N1, dy.get(), N2, cuda::OutType::F32, kSlices);
  ctx.sync();
  const std::vector<float> want = from_device<float>(dy, size_t(M * N2));
  for (int round = 0; round < 10; ++round) {
    CM_CUDA(cudaMemsetAsync(dh.get(), 0xFF, dh.size(), ctx.stream()));
    cuda::linear_nvfp4_tiles(ctx, d1, dx.as<const uint16_t>(), M, K1, dh.get(), N1, cuda::OutType::BF16);
    cuda::linear_nvfp4_tiles(ctx, d2, dh.as<const uint16_t>(), M, N1, dy.get(), N2, cuda::OutType::F32);
    ctx.sync();
    const std::vector<float> got = from_device<float>(dy, want.size());
    if (std::memcmp(got.data(), want.data(), got.size() * 4) != 0) {
      c.same_bits(got.data(), want.data(), got.size() * 4, "round " + std::to_string(round) + " vs the decode chain");
      return;
    }
  }
}

void nvfp4_dispatch(cuda::Context& ctx, Checker& c) {
  LinearWeight w = random_nvfp4(64, 4096, 5);
  auto is = [&](const char* got, const char* want, const std::string& what) {
    c.expect(std::string(got) == want, what + ": " + got + ", expected " + want);
  };
  // rows per group (32) below the wgmma tile: Auto takes cuBLAS, forcing wgmma is refused
  cuda::DeviceLinear grouped = cuda::upload_nvfp4(w, 2);
  is(cuda::linear_nvfp4_path(grouped, 100), "dequant+cuBLAS", "grouped M=100");
  is(cuda::linear_nvfp4_path(grouped, 64), "mma.sync decode", "grouped M=64");
  cuda::DeviceBuffer x(size_t(100 * 8192) * 2), y(size_t(100 * 64) * 4);
  bool threw = false;
  try {
    cuda::linear_nvfp4(ctx, grouped, x.as<const uint16_t>(), 100, 8192, y.get(), 64, cuda::OutType::F32, 64,
                       cuda::PrefillKernel::Wgmma);
  } catch (const Error&) {
    threw = true;
  }
  c.expect(threw, "forcing wgmma on 32 rows per group must throw");
  cuda::DeviceLinear plain = cuda::upload_nvfp4(w, 1);
  // Auto: wgmma for large weights up to M = 256, dequant + cuBLAS otherwise
  is(cuda::linear_nvfp4_path(plain, 65), "dequant+cuBLAS", "64x4096 M=65");
  is(cuda::linear_nvfp4_path(plain, 65, 64, cuda::PrefillKernel::Wgmma), "wgmma", "64x4096 M=65 forced");
  cuda::DeviceLinear big = cuda::random_nvfp4(8192, 4096, 9);
  is(cuda::linear_nvfp4_path(big, 65), "wgmma", "8192x4096 M=65");
  is(cuda::linear_nvfp4_path(big, 256), "wgmma", "8192x4096 M=256");
  is(cuda::linear_nvfp4_path(big, 257), "dequant+cuBLAS", "8192x4096 M=257");
  is(cuda::linear_nvfp4_path(big, 257, 512), "mma.sync decode", "8192x4096 M=257 decode_max_m 512");
  // the model's dispatch: decode slices below kNvfp4TilesMinRows, the prefill kernel from there
  cuda::DeviceLinear w2 = cuda::random_nvfp4(256, 512, 3);
  const int64_t dmax = cuda::kNvfp4TilesMinRows - 1;
  is(cuda::linear_nvfp4_path(w2, dmax, dmax, cuda::PrefillKernel::MmaTiles), "mma.sync decode", "tiles below min");
  is(cuda::linear_nvfp4_path(w2, dmax + 1, dmax, cuda::PrefillKernel::MmaTiles), "mma.sync prefill", "tiles at min");
}

// The bf16 dequant panel of FP8 (pow2 scales) and MXFP4 weights equals the CPU expansion bit for bit.
void fp8_panel(cuda::Context& ctx, Checker& c) {
  for (auto [N, K] : {std::pair<int64_t, int64_t>{200, 336}, {256, 1024}}) {
    LinearWeight w = testw::random_fp8(N, K, uint64_t(N + K), Fp8Scales::E8M0);
    cuda::DeviceFp8Linear dw = cuda::upload_fp8(w);
    const int64_t row0 = 32, rows = N - row0;
    Guarded<uint16_t> panel(size_t(rows * K));
    cuda::dequant_fp8_bf16(ctx, dw, row0, rows, panel.ptr());
    ctx.sync();
    const std::vector<uint16_t> got = panel.get(c, "fp8 panel");
    std::vector<float> row(static_cast<size_t>(K));
    int64_t bad = 0;
    for (int64_t n = row0; n < N; ++n) {
      linear_expand_row(w, n, row.data());
      for (int64_t k = 0; k < K; ++k) bad += bf16_to_f32(got[size_t((n - row0) * K + k)]) != row[size_t(k)];
    }
    c.expect(bad == 0, "fp8 panel " + std::to_string(N) + "x" + std::to_string(K) + ": " + std::to_string(bad) +
                           " values differ from the CPU expansion");
  }
  LinearWeight f = testw::random_fp8(64, 128, 3, Fp8Scales::F32_ANY);
  cuda::DeviceFp8Linear df = cuda::upload_fp8(f);
  cuda::DeviceBuffer panel(size_t(64 * 128) * 2);
  bool threw = false;
  try {
    cuda::dequant_fp8_bf16(ctx, df, 0, 64, panel.as<uint16_t>());
  } catch (const Error&) {
    threw = true;
  }
  c.expect(threw, "the fp8 panel of non-pow2 F32 scales must throw");
}

void mxfp4_panel(cuda::Context& ctx, Checker& c) {
  // 32 binades, the widest the layout holds; all values representable in bf16.
  const int64_t N = 200, K = 320;
  LinearWeight w = testw::random_mxfp4(N, K, 11, 100, 131);
  cuda::DeviceLinear dw = cuda::upload_nvfp4(w);
  Guarded<uint16_t> panel(size_t(N * K));
  cuda::dequant_nvfp4_bf16(ctx, dw, 0, N, panel.ptr(), true);
  ctx.sync();
  const std::vector<uint16_t> got = panel.get(c, "mxfp4 panel");
  std::vector<float> row(static_cast<size_t>(K));
  int64_t bad = 0;
  for (int64_t n = 0; n < N; ++n) {
    linear_expand_row(w, n, row.data());
    for (int64_t k = 0; k < K; ++k) bad += bf16_to_f32(got[size_t(n * K + k)]) != row[size_t(k)];
  }
  c.expect(bad == 0, "mxfp4 panel: " + std::to_string(bad) + " values differ from the CPU expansion");
}

void fp8_splitk_deterministic(cuda::Context& ctx, Checker& c) {
  LinearWeight w = testw::random_fp8(1024, 4096, 5, Fp8Scales::F32_ANY);
  cuda::DeviceFp8Linear dw = cuda::upload_fp8(w);
  for (int64_t M : {1, 16, 32}) {
    std::vector<uint16_t> xb;
    std::vector<float> xf;
    random_bf16(size_t(M * 4096), 9 + uint64_t(M), 2.0f, xb, xf);
    cuda::DeviceBuffer dx = to_device(xb), dy(size_t(M * 1024) * 4);
    std::vector<float> first;
    for (int rep = 0; rep < 3; ++rep) {
      cuda::linear_fp8(ctx, dw, dx.as<const uint16_t>(), M, 4096, dy.get(), 1024, cuda::OutType::F32);
      ctx.sync();
      const std::vector<float> y = from_device<float>(dy, size_t(M * 1024));
      if (rep == 0) first = y;
      else c.same_bits(first.data(), y.data(), y.size() * 4, "M=" + std::to_string(M) + " repeat " + std::to_string(rep));
    }
  }
}

// The FP8 shapes of the table cover both K layouts: split K and unsplit.
void fp8_split_cover(cuda::Context& ctx, Checker& c) {
  auto splits = [&](int64_t N, int64_t K, int groups) {
    cuda::DeviceFp8Linear dw = cuda::upload_fp8(testw::random_fp8(N, K, 1, Fp8Scales::E8M0), groups);
    const int64_t per = cuda::fp8_chunks_per_split(ctx, dw);
    return (dw.chunks + per - 1) / per;
  };
  c.expect(splits(2048, 4096, 1) > 1, "2048x4096 splits K");
  c.expect(splits(300, 1152, 1) > 1, "300x1152 splits K");
  c.expect(splits(160, 1152, 2) > 1, "160x1152 G2 splits K");
  c.expect(splits(32768, 1024, 1) == 1, "32768x1024 does not split K");
  c.expect(splits(16900, 384, 1) == 1, "16900x384 does not split K");
}

// The engine's entry (run_linear: the prefill kernels from kFp8PrefillMinM rows): a prompt in chunks on either
// side of the threshold gives the bits of the whole, of the decode kernel and of both prefill kernels.
void fp8_run_linear_chunks(cuda::Context& ctx, Checker& c) {
  const int64_t N = 1024, K = 4096, M = 4 * cuda::kFp8PrefillMinM + 5;
  cuda::DevLinear dl;
  dl.name = "test.fp8";
  dl.format = WeightFormat::FP8_BLOCK;
  dl.N = N;
  dl.K = K;
  dl.fp8 = std::make_unique<cuda::DeviceFp8Linear>(cuda::upload_fp8(testw::random_fp8(N, K, 77, Fp8Scales::E8M0)));
  std::vector<uint16_t> xb;
  std::vector<float> xf;
  random_bf16(size_t(M * K), 78, 2.0f, xb, xf);
  cuda::DeviceBuffer dx = to_device(xb);
  const uint16_t* x = dx.as<const uint16_t>();
  auto rows = [&](int64_t m0, int64_t count, void* y, int64_t ldy) {
    cuda::run_linear(ctx, dl, x + m0 * K, true, count, K, static_cast<uint16_t*>(y) + m0 * ldy, true, ldy, nullptr);
  };
  GuardedRows gw(M, N, 2), gc(M, N, 2), gd(M, N, 2), gp(M, N, 2);
  rows(0, M, gw.ptr(), gw.ld());
  // chunks of 200 (prefill kernel), 127 (decode), 189 (prefill) and 1 (decode)
  rows(0, 200, gc.ptr(), gc.ld());
  rows(200, 127, gc.ptr(), gc.ld());
  rows(327, M - 328, gc.ptr(), gc.ld());
  rows(M - 1, 1, gc.ptr(), gc.ld());
  const std::string pd = cuda::linear_fp8(ctx, *dl.fp8, x, M, K, gd.ptr(), gd.ld(), cuda::OutType::BF16, kSlices);
  const std::string pp = cuda::linear_fp8(ctx, *dl.fp8, x, M, K, gp.ptr(), gp.ld(), cuda::OutType::BF16,
                                          cuda::kFp8PrefillMinM - 1, cuda::Fp8Prefill::Exact);
  GuardedRows gt(M, N, 2);
  cuda::linear_fp8_prefill(ctx, *dl.fp8, x, M, K, gt.ptr(), gt.ld(), cuda::OutType::BF16);
  c.expect(pd == cuda::kFp8PathDecode, "decode path " + pd);
  c.expect(pp == cuda::kFp8PathExactWgmma, "prefill path " + pp);
  const std::vector<uint8_t> whole = gw.raw(c, "whole"), chunked = gc.raw(c, "chunked"), dec = gd.raw(c, "decode"),
                             pre = gp.raw(c, "prefill"), tiles = gt.raw(c, "mma.sync prefill");
  c.same_bits(whole.data(), chunked.data(), whole.size(), "whole vs chunks of 200, 127, 189, 1");
  c.same_bits(whole.data(), dec.data(), whole.size(), "whole vs the decode kernel");
  c.same_bits(whole.data(), pre.data(), whole.size(), "whole vs the wgmma prefill kernel");
  c.same_bits(whole.data(), tiles.data(), whole.size(), "whole vs the mma.sync prefill kernel");
}


// The model's call (run_linear, batch-invariant) gives a row the same bits alone, in a batch of 7, of 300
// and of 4,000, whatever kernel each M takes (decode, mma.sync tiles, the exact wgmma kernel).
void run_linear_invariance(cuda::Context& ctx, Checker& c, Shape s) {
  const int64_t KX = s.K * s.G, M = 4000;
  LinearWeight w = random_nvfp4(s.N, s.K, uint64_t(s.N * 3 + s.K));
  const cuda::DevLinear dw = cuda::upload_linear(w, s.G);
  std::vector<uint16_t> xb;
  std::vector<float> xf;
  random_bf16(size_t(M * KX), 11, 2.0f, xb, xf);
  const cuda::DeviceBuffer dx = to_device(xb);
  for (bool bf16 : {false, true}) {
    const size_t es = bf16 ? 2 : 4, row = size_t(s.N) * es;
    auto call = [&](int64_t m0, int64_t rows) {
      GuardedRows g(rows, s.N, es);
      cuda::run_linear(ctx, dw, dx.as<const uint16_t>() + m0 * KX, true, rows, KX, g.ptr(), bf16, g.ld(), nullptr);
      return g.raw(c);
    };
    const std::vector<uint8_t> all = call(0, M), b300 = call(0, 300), b7 = call(0, 7);
    for (int64_t m : {int64_t(0), int64_t(6)}) {
      const std::vector<uint8_t> one = call(m, 1);
      c.same_bits(one.data(), &b7[size_t(m) * row], row, "row " + std::to_string(m) + " alone vs in 7 rows");
      c.same_bits(one.data(), &b300[size_t(m) * row], row, "row " + std::to_string(m) + " alone vs in 300 rows");
      c.same_bits(one.data(), &all[size_t(m) * row], row, "row " + std::to_string(m) + " alone vs in 4000 rows");
    }
    for (int64_t m : {int64_t(299), int64_t(3999)}) {
      const std::vector<uint8_t> one = call(m, 1);
      c.same_bits(one.data(), &all[size_t(m) * row], row, "row " + std::to_string(m) + " alone vs in 4000 rows");
    }
    c.same_bits(b300.data(), all.data(), b300.size(), "300 rows vs the first 300 of 4000");
  }
}

OpCase host_case(const std::string& family, const std::string& name, std::function<void(Checker&)> fn) {
  OpCase c;
  c.family = family;
  c.name = family + "_" + name;
  c.metric = "exact";
  c.check_only = true;
  c.bench = false;
  c.host_check = std::move(fn);
  return c;
}

}  // namespace

void add_linear_cases(std::vector<OpCase>& out) {
  // V4-Flash's linear shapes (out N, in K, groups): expert w1/w3, expert w2, attention wq_a, wq_b, wkv,
  // grouped wo_a (8 x 4096->1024), wo_b, and the LM head.
  const Shape w13{2048, 4096, 1}, w2{4096, 2048, 1}, q_a{1024, 4096, 1}, q_b{32768, 1024, 1}, kv{512, 4096, 1},
      wo_a{8192, 4096, 8}, wo_b{4096, 8192, 1}, head{129280, 4096, 1};
  const std::vector<int64_t> bench_ms = {1, 4, 16, 64, 256, 4096};

  // ---- NVFP4 ----
  Spec nv;
  nv.fmt = Fmt::NVFP4;
  // The bench grid: every shape at every M, the default path; M > 64 also the other prefill kernels (wgmma,
  // dequant + cuBLAS, the mma.sync tiles with decode bits, the decode kernel in slices); 16 < M <= 64 the wgmma
  // kernel in place of the decode kernel. The head and M >= 256 are huge (sampled by the default test run).
  for (const Shape& s : {w13, w2, q_a, q_b, kv, wo_a, wo_b, head})
    for (int64_t M : bench_ms) {
      const bool huge = M >= 256 || s.N == head.N;
      std::vector<Var> vars = {Var::Auto};
      if (M > 64) vars.insert(vars.end(), {Var::Wgmma, Var::Cublas, Var::Tiles, Var::Slices});
      if (M > 64) vars.push_back(Var::XWgmma);
      if (M > 16 && M <= 64) vars.push_back(Var::WgmmaAll);
      for (Var v : vars) {
        nv.var = v;
        grid(out, nv, {s}, {M}, true, huge);
      }
    }
  nv.var = Var::Auto;
  // odd small shapes (ragged N and K, groups of 2, many row blocks: the unsplit plain-loop variant)
  grid(out, nv, {{16, 16, 1}, {3, 64, 1}, {17, 48, 1}, {40, 80, 1}, {100, 1008, 1}, {64, 4096, 2}},
       {1, 2, 7, 8, 9, 16, 17, 31, 40, 64, 65, 100});
  grid(out, nv, {{16900, 80, 1}}, {1, 9, 20});
  // Flash shapes at the M of the decode tests
  grid(out, nv, {w13, w2, q_a, kv}, {1, 4, 16, 33, 80});
  grid(out, nv, {q_b}, {1, 5, 70});
  grid(out, nv, {wo_a}, {1, 3, 70});
  grid(out, nv, {wo_b}, {1, 9, 70});
  grid(out, nv, {head}, {2}, false, true);
  grid(out, nv, {{64, 4096, 2}}, {100});  // grouped, 32 rows per group: Auto takes cuBLAS
  // the prefill kernels forced: wgmma (token tiles of 64, 128, 256, split-K or not, ragged) and dequant + cuBLAS
  for (Var v : {Var::Wgmma, Var::Cublas}) {
    nv.var = v;
    grid(out, nv, {{16, 16, 1}, {100, 1008, 1}, {130, 80, 1}}, {65, 128, 129, 255, 300});
    grid(out, nv, {{3, 64, 1}}, {65, 70});
    grid(out, nv, {w13}, {300, 1000});
    grid(out, nv, {w2}, {257});
    grid(out, nv, {kv}, {130});
    grid(out, nv, {wo_a}, {140});
    grid(out, nv, {wo_b}, {129});
    grid(out, nv, {{16900, 80, 1}}, {200});
    grid(out, nv, {q_b}, {600});
    grid(out, nv, {{10000, 192, 1}}, {250});
  }
  nv.var = Var::WgmmaAll;  // the wgmma kernel below 64 rows
  grid(out, nv, {{40, 80, 1}}, {1, 9, 64});
  grid(out, nv, {w13}, {1, 16, 64});
  grid(out, nv, {wo_a}, {3});
  // the mma.sync prefill kernel: the decode kernel's bits (batch invariance) on Flash and odd shapes
  nv.var = Var::Tiles;
  grid(out, nv, {q_a, q_b, wo_a, wo_b, w13, w2, kv}, {129, 2048});
  grid(out, nv, {{1000, 64 * 23, 1}, {100, 1008, 1}, {3, 64, 1}, {130, 80, 1}, {64, 4096, 2}}, {65, 129, 1000, 2048});
  grid(out, nv, {{96, 64 * 7, 3}, {16900, 80, 1}}, {65, 1000});
  grid(out, nv, {{10000, 192, 1}}, {129});
  // the wgmma kernel with the decode kernel's bits: Flash shapes (q_a, kv: many K splits; w13: 3; the
  // others 1), ragged M, N and K, grouped (128-row groups), splits of fewer than 4 chunks, and wo_b at
  // 3000 rows: two passes through the reorder scratch
  nv.var = Var::XWgmma;
  grid(out, nv, {w13, w2, q_a, kv, q_b, wo_a, wo_b}, {1, 7, 129, 300, 2048});
  grid(out, nv, {{300, 64 * 23, 1}, {16900, 80 * 4, 1}, {1000, 1008, 1}, {2048, 1024, 2}, {256, 1024, 2}, {40, 80, 1}},
       {1, 65, 200, 1000});
  grid(out, nv, {wo_b}, {3000});
  for (Shape s : {w13, w2, q_a, wo_b, wo_a, Shape{100, 1008, 1}})
    add_case(out, check_only_case("linear_nvfp4", case_name("decode_invariance", {{"N", s.N}, {"K", s.K}, {"G", s.G}}),
                             [s](cuda::Context& ctx, Checker& c) { decode_invariance(ctx, c, s); }));
  add_case(out, check_only_case("linear_nvfp4", "dispatch", nvfp4_dispatch, "exact"));
  for (Shape s : {w13, w2, q_a, q_b, wo_a, wo_b})
    add_case(out, check_only_case("linear_nvfp4", case_name("run_linear_invariance", {{"N", s.N}, {"K", s.K}, {"G", s.G}}),
                             [s](cuda::Context& ctx, Checker& c) { run_linear_invariance(ctx, c, s); }));
  for (bool pdl : {true, false}) {
    add_case(out, check_only_case("linear_nvfp4", std::string("chained_decode_pdl") + (pdl ? "1" : "0"),
                             [pdl](cuda::Context&, Checker& c) { chained_decode(c, pdl); }, "||y-ref||/||ref|| 2e-3"));
    add_case(out, check_only_case("linear_nvfp4", std::string("chained_tiles_pdl") + (pdl ? "1" : "0"),
                             [pdl](cuda::Context&, Checker& c) { chained_tiles(c, pdl); }));
  }
  add_case(out, host_case("linear_nvfp4", "packed_layout", [](Checker& c) {
    // the repacked bytes decode to exactly linear_expand_row's values
    for (auto [N, K] : {std::pair<int64_t, int64_t>{40, 80}, {16, 64}, {33, 1008}}) {
      LinearWeight w = random_nvfp4(N, K, uint64_t(N * 7 + K));
      cuda::Nvfp4Packed p = cuda::pack_nvfp4(w);
      std::vector<float> row(static_cast<size_t>(K));
      int64_t bad = 0;
      for (int64_t n = 0; n < N; ++n) {
        linear_expand_row(w, n, row.data());
        for (int64_t k = 0; k < K; ++k) bad += cuda::packed_nvfp4_value(p, n, k) != row[size_t(k)];
      }
      c.expect(bad == 0, std::to_string(bad) + " packed values differ");
    }
  }));
  add_case(out, host_case("linear_nvfp4", "rejects_nan_scale", [](Checker& c) {
    LinearWeight w = random_nvfp4(16, 64, 3);
    w.owned_scale[5] = 0x7f;
    bool threw = false;
    try {
      cuda::pack_nvfp4(w);
    } catch (const Error&) {
      threw = true;
    }
    c.expect(threw, "a NaN block scale must be refused");
  }));

  // ---- MXFP4 (DeepSeek's release expert format, through the NVFP4 kernels after the repack) ----
  Spec mx;
  mx.fmt = Fmt::MXFP4;
  mx.e_lo = 115;
  mx.e_hi = 124;
  grid(out, mx, {w13, w2}, bench_ms, true);
  grid(out, mx, {w13, w2}, {3, 65, 300});
  // odd shapes, exponent spans up to the 32 binades the packed byte holds
  for (auto [N, K, lo, hi] : {std::tuple<int64_t, int64_t, int, int>{40, 96, 100, 131}, {33, 1056, 110, 141},
                              {200, 320, 127, 127}, {16, 32, 120, 126}}) {
    mx.e_lo = lo;
    mx.e_hi = hi;
    grid(out, mx, {{N, K, 1}}, {1, 7, 9, 17, 33, 64, 65, 100});
  }
  add_case(out, check_only_case("linear_mxfp4", "dequant_panel", mxfp4_panel));

  // ---- FP8 128x128 blocks ----
  Spec f8;
  f8.fmt = Fmt::FP8;
  const Shape fp8_sh{2048, 4096, 1};  // shared expert w1/w3
  // the bench grid (E8M0 scales as released): default path; M > 64 also the decode slices and the prefill kernel
  for (const Shape& s : {q_a, q_b, wo_a, wo_b, fp8_sh})
    for (int64_t M : bench_ms) {
      std::vector<Var> vars = {Var::Auto};
      if (M > 64) vars.insert(vars.end(), {Var::Slices, Var::Exact, Var::XWgmma});
      for (Var v : vars) {
        f8.var = v;
        grid(out, f8, {s}, {M}, true, M >= 256);
      }
    }
  f8.var = Var::Auto;
  const std::vector<int64_t> odd_ms = {1, 2, 7, 8, 9, 16, 17, 31, 33, 64, 65, 100, 300};
  for (Fp8Scales sc : {Fp8Scales::E8M0, Fp8Scales::F32_POW2, Fp8Scales::F32_ANY}) {
    f8.scales = sc;
    grid(out, f8, {{16, 16, 1}, {3, 64, 1}, {200, 336, 1}, {130, 272, 1}, {300, 1040, 1}, {160, 208, 2}}, odd_ms);
    grid(out, f8, {{16900, 208, 1}}, {1, 9, 20, 65});
  }
  f8.scales = Fp8Scales::E8M0;
  grid(out, f8, {q_a, q_b, kv, wo_a, wo_b}, {1, 3, 16, 64, 65, 300});
  for (Fp8Scales sc : {Fp8Scales::F32_ANY, Fp8Scales::F32_POW2}) {
    f8.scales = sc;
    grid(out, f8, {q_a}, {1, 16, 65});
    grid(out, f8, {wo_a}, {3, 64, 65});
    grid(out, f8, {wo_b}, {1, 65});
    grid(out, f8, {q_b}, {3, 65});
  }
  // the prefill kernel: the decode kernel's bits (batch invariance), odd and Flash shapes
  f8.var = Var::Exact;
  for (Fp8Scales sc : {Fp8Scales::E8M0, Fp8Scales::F32_ANY}) {
    f8.scales = sc;
    grid(out, f8, {{200, 384, 1}, {130, 640, 1}, {300, 1152, 1}, {16, 336, 1}, {160, 1152, 2}}, {65, 129, 1000, 2048});
    grid(out, f8, {{1000, 208, 1}}, {65, 1000});
    grid(out, f8, {{480, 384, 3}}, {129, 1000});
    grid(out, f8, {{16900, 384, 1}}, {129, 300});
  }
  f8.scales = Fp8Scales::E8M0;
  grid(out, f8, {wo_a, wo_b, q_b, fp8_sh, q_a}, {129, 2048});
  f8.scales = Fp8Scales::F32_ANY;
  grid(out, f8, {fp8_sh, wo_a}, {1000});
  // the wgmma kernel with the decode kernel's bits: Flash shapes (q_a, kv: many K splits), ragged M, N
  // and K, grouped (128-row groups), E8M0 and arbitrary F32 scales
  f8.var = Var::XWgmma;
  for (Fp8Scales sc : {Fp8Scales::E8M0, Fp8Scales::F32_ANY}) {
    f8.scales = sc;
    grid(out, f8, {{200, 384, 1}, {130, 640, 1}, {300, 1152, 1}, {16, 336, 1}, {256, 1152, 2}, {16900, 384, 1}},
         {1, 65, 200, 1000});
  }
  f8.scales = Fp8Scales::E8M0;
  grid(out, f8, {q_a, kv, q_b, wo_a, wo_b, fp8_sh}, {1, 7, 129, 300, 2048});
  add_case(out, check_only_case("linear_fp8", "dequant_panel", fp8_panel));
  add_case(out, check_only_case("linear_fp8", "splitk_deterministic", fp8_splitk_deterministic));
  add_case(out, check_only_case("linear_fp8", "split_and_unsplit_k", fp8_split_cover, "exact"));
  add_case(out, check_only_case("linear_fp8", "run_linear_chunks", fp8_run_linear_chunks));
  add_case(out, host_case("linear_fp8", "upload_rejects_bad_groups", [](Checker& c) {
    LinearWeight w = testw::random_fp8(160, 64, 1, Fp8Scales::E8M0, "layers.0.attn.wo_a");
    std::string what;
    try {
      cuda::upload_fp8(w, 3);  // 160 rows are not 3 groups of whole 16-row blocks
    } catch (const Error& e) {
      what = e.what();
    }
    c.expect(what.find("layers.0.attn.wo_a") != std::string::npos, "expected an error naming the tensor, got '" + what + "'");
  }));
}

}  // namespace cm::optable
