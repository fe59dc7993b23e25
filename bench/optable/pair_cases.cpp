// Two decode linears of one input in one launch (linear_fp8_pair,
// linear_nvfp4_pair: q_a and kv at decode) against the two launches they
// replace, bit for bit (f32 and bf16 outputs), and against the CPU linear
// (||y - ref|| / ||ref|| <= 1e-5 f32, 1e-2 bf16). Shapes: V4-Flash's wq_a
// (1024 x 4096) and wkv (512 x 4096), the tiny fixture's, odd ones (N not a
// multiple of 16, K not of 64); M = 1, 3, 17, 32 (the three MT variants). A
// second pair launch gives the same bits (the split-K counters were reset).
// Check-only: the cases the pair declines (launching nothing), and that the
// bf16 output of the FP8/NVFP4 linears on run_linear's paths and of SwiGLU is
// the cast of their f32 output, bit for bit.
#include <memory>

#include "backend/cuda/linear/linear.h"
#include "backend/cuda/step/step_kernels.h"
#include "bench/optable/op_case.h"
#include "bench/optable/op_util.h"
#include "ops/swiglu.h"
#include "tests/release_weights.h"

namespace cm::optable {
namespace {

using testw::Fp8Scales;

std::vector<float> reference(const LinearWeight& w, const std::vector<float>& x, int64_t M) {
  std::vector<float> y(size_t(M * w.out_features));
  linear_cpu(w, x.data(), M, y.data());
  return y;
}

std::vector<float> as_f32(const std::vector<uint8_t>& raw, bool f32) {
  std::vector<float> v(raw.size() / (f32 ? 4 : 2));
  for (size_t i = 0; i < v.size(); ++i) {
    if (f32) {
      std::memcpy(&v[i], &raw[4 * i], 4);
    } else {
      uint16_t b;
      std::memcpy(&b, &raw[2 * i], 2);
      v[i] = bf16_to_f32(b);
    }
  }
  return v;
}

class PairRun : public OpRun {
 public:
  PairRun(bool fp8, int64_t Na, int64_t Nb, int64_t K, int64_t M, uint64_t seed) : fp8_(fp8), Na_(Na), Nb_(Nb), K_(K), M_(M) {
    if (fp8) {
      wa_ = testw::random_fp8(Na, K, seed, Fp8Scales::E8M0, "test.fp8.wq_a");
      wb_ = testw::random_fp8(Nb, K, seed + 1, Fp8Scales::F32_ANY, "test.fp8.wkv");
      fa_ = cuda::upload_fp8(wa_);
      fb_ = cuda::upload_fp8(wb_);
    } else {
      wa_ = random_nvfp4(Na, K, seed);
      wb_ = random_nvfp4(Nb, K, seed + 1, 0.5f);
      na_ = cuda::upload_nvfp4(wa_);
      nb_ = cuda::upload_nvfp4(wb_);
    }
    std::vector<uint16_t> xb;
    random_bf16(size_t(M * K), seed * 7 + uint64_t(M), 2.0f, xb, xf_);
    x_ = to_device(xb);
    ya_ = cuda::DeviceBuffer(size_t(M * Na) * 4);
    yb_ = cuda::DeviceBuffer(size_t(M * Nb) * 4);
  }
  double bytes() const override {
    return double(fp8_ ? fa_.device_bytes() + fb_.device_bytes() : na_.device_bytes() + nb_.device_bytes()) +
           double(M_ * K_) * 2 + double(M_ * (Na_ + Nb_)) * 4;
  }
  double weight_bytes() const override {
    return double(fp8_ ? fa_.device_bytes() + fb_.device_bytes() : na_.device_bytes() + nb_.device_bytes());
  }
  double flops() const override { return 2.0 * double(M_) * double(Na_ + Nb_) * double(K_); }
  std::string path() const override { return fp8_ ? "linear_fp8_pair" : "linear_nvfp4_pair"; }
  void run(cuda::Context& ctx, int) override { pair(ctx, ya_.get(), yb_.get(), cuda::OutType::F32); }

  void check(cuda::Context& ctx, Checker& c) override {
    const std::vector<float> ra = reference(wa_, xf_, M_), rb = reference(wb_, xf_, M_);
    for (int rep = 0; rep < 2; ++rep)  // rep 1: a second launch (the split-K counters were left at zero)
      for (cuda::OutType ot : {cuda::OutType::F32, cuda::OutType::BF16}) {
        const bool f32 = ot == cuda::OutType::F32;
        const size_t es = f32 ? 4 : 2;
        const std::string tag = std::string(f32 ? "f32" : "bf16") + (rep ? " (second launch)" : "");
        Guarded<uint8_t> ya(size_t(M_ * Na_) * es), yb(size_t(M_ * Nb_) * es);
        Guarded<uint8_t> sa(size_t(M_ * Na_) * es), sb(size_t(M_ * Nb_) * es);
        // these shapes are far below 8 row blocks per SM: both split, the pair always runs
        c.expect(pair(ctx, ya.ptr(), yb.ptr(), ot), tag + ": the pair declined");
        single(ctx, 0, sa.ptr(), ot);
        single(ctx, 1, sb.ptr(), ot);
        ctx.sync();
        const std::vector<uint8_t> ga = ya.get(c), gb = yb.get(c), ha = sa.get(c), hb = sb.get(c);
        c.same_bits(ga.data(), ha.data(), ga.size(), tag + " first linear: pair vs alone");
        c.same_bits(gb.data(), hb.data(), gb.size(), tag + " second linear: pair vs alone");
        int64_t bad = 0, bad2 = 0;
        c.err(tag + " first ||y-ref||/||ref||", rel_error(as_f32(ga, f32), ra, &bad), f32 ? 1e-5 : 1e-2);
        c.err(tag + " second ||y-ref||/||ref||", rel_error(as_f32(gb, f32), rb, &bad2), f32 ? 1e-5 : 1e-2);
        c.expect(bad + bad2 == 0, tag + ": non-finite outputs");
      }
  }

 private:
  bool pair(cuda::Context& ctx, void* ya, void* yb, cuda::OutType ot) {
    const uint16_t* x = x_.as<const uint16_t>();
    return fp8_ ? cuda::linear_fp8_pair(ctx, fa_, fb_, x, M_, K_, ya, Na_, yb, Nb_, ot)
                : cuda::linear_nvfp4_pair(ctx, na_, nb_, x, M_, K_, ya, Na_, yb, Nb_, ot);
  }
  void single(cuda::Context& ctx, int k, void* y, cuda::OutType ot) {
    const uint16_t* x = x_.as<const uint16_t>();
    if (fp8_) cuda::linear_fp8(ctx, k ? fb_ : fa_, x, M_, K_, y, k ? Nb_ : Na_, ot);
    else cuda::linear_nvfp4(ctx, k ? nb_ : na_, x, M_, K_, y, k ? Nb_ : Na_, ot);
  }

  bool fp8_;
  int64_t Na_, Nb_, K_, M_;
  LinearWeight wa_, wb_;
  cuda::DeviceFp8Linear fa_, fb_;
  cuda::DeviceLinear na_, nb_;
  std::vector<float> xf_;
  cuda::DeviceBuffer x_, ya_, yb_;
};

void declines(cuda::Context& ctx, Checker& c) {
  const cuda::DeviceFp8Linear a = cuda::upload_fp8(testw::random_fp8(256, 512, 1, Fp8Scales::E8M0));
  const cuda::DeviceFp8Linear b = cuda::upload_fp8(testw::random_fp8(128, 512, 2, Fp8Scales::E8M0));
  const cuda::DeviceFp8Linear k = cuda::upload_fp8(testw::random_fp8(128, 256, 3, Fp8Scales::E8M0));
  const cuda::DeviceFp8Linear g = cuda::upload_fp8(testw::random_fp8(256, 512, 4, Fp8Scales::E8M0), 2);  // grouped
  cuda::DeviceBuffer x(64 * 512 * 2);
  Guarded<float> ya(64 * 256), yb(64 * 256);
  const uint16_t* xp = x.as<const uint16_t>();
  c.expect(!cuda::linear_fp8_pair(ctx, a, b, xp, 33, 512, ya.ptr(), 256, yb.ptr(), 128, cuda::OutType::F32), "M = 33 paired");
  c.expect(!cuda::linear_fp8_pair(ctx, a, k, xp, 1, 512, ya.ptr(), 256, yb.ptr(), 128, cuda::OutType::F32),
           "different K paired");
  c.expect(!cuda::linear_fp8_pair(ctx, g, b, xp, 1, 512, ya.ptr(), 256, yb.ptr(), 128, cuda::OutType::F32),
           "a grouped weight paired");
  ctx.sync();
  int64_t written = 0;
  for (float v : ya.get(c)) written += !std::isnan(v);
  for (float v : yb.get(c)) written += !std::isnan(v);
  c.expect(written == 0, "a declined pair wrote " + std::to_string(written) + " outputs");
}

// wo_a and the experts' SwiGLU write bf16 for an FP8/NVFP4 consumer instead of f32 that run_linear then casts:
// the same bits, on every path run_linear takes (decode below 128 rows, the prefill kernels from there).
void bf16_is_cast(cuda::Context& ctx, Checker& c) {
  const int64_t N = 520, K = 1024;  // N: row blocks past one 128-row tile, not a multiple of 16*8
  const cuda::DeviceFp8Linear f8 = cuda::upload_fp8(testw::random_fp8(N, K, 7, Fp8Scales::F32_ANY));
  const cuda::DeviceLinear f4 = cuda::upload_nvfp4(random_nvfp4(N, K, 8));
  for (int64_t M : {1, 17, 40, 127, 128, 200}) {
    std::vector<uint16_t> xb;
    std::vector<float> xf;
    random_bf16(size_t(M * K), 50 + uint64_t(M), 2.0f, xb, xf);
    cuda::DeviceBuffer dx = to_device(xb);
    const uint16_t* x = dx.as<const uint16_t>();
    for (int fmt = 0; fmt < 2; ++fmt) {
      Guarded<float> yf(size_t(M * N));
      Guarded<uint16_t> yb(size_t(M * N));
      cuda::DeviceBuffer cast(size_t(M * N) * 2);
      for (int bf = 0; bf < 2; ++bf) {  // run_linear's calls
        void* y = bf ? static_cast<void*>(yb.ptr()) : static_cast<void*>(yf.ptr());
        const cuda::OutType ot = bf ? cuda::OutType::BF16 : cuda::OutType::F32;
        if (fmt) cuda::linear_nvfp4(ctx, f4, x, M, K, y, N, ot, cuda::kNvfp4TilesMinRows - 1, cuda::PrefillKernel::MmaTiles);
        else cuda::linear_fp8(ctx, f8, x, M, K, y, N, ot, cuda::kFp8PrefillMinM - 1, cuda::Fp8Prefill::Exact);
      }
      cuda::cast_f32_bf16(ctx, yf.ptr(), N, M, N, cast.as<uint16_t>(), N);
      ctx.sync();
      const std::vector<uint16_t> got = yb.get(c), want = from_device<uint16_t>(cast, size_t(M * N));
      (void)yf.get(c);
      c.same_bits(got.data(), want.data(), got.size() * 2,
                  std::string(fmt ? "nvfp4" : "fp8") + " M=" + std::to_string(M) + " bf16 out vs cast of f32 out");
    }
  }
  // SwiGLU (the shared expert's, 2048 wide in V4-Flash), with the clamp
  Rng r(9);
  const int64_t rows = 5, I = 2048;
  const std::vector<float> g = rand_f32(size_t(rows * I), r, 12.0f), u = rand_f32(size_t(rows * I), r, 12.0f);
  cuda::DeviceBuffer dg = to_device(g), du = to_device(u), cast(size_t(rows * I) * 2);
  Guarded<float> hf(size_t(rows * I));
  Guarded<uint16_t> hb(size_t(rows * I));
  swiglu_cuda(ctx, dg.as<float>(), du.as<float>(), I, rows, I, 10.0f, nullptr, hf.ptr(), false);
  swiglu_cuda(ctx, dg.as<float>(), du.as<float>(), I, rows, I, 10.0f, nullptr, hb.ptr(), true);
  cuda::cast_f32_bf16(ctx, hf.ptr(), I, rows, I, cast.as<uint16_t>(), I);
  ctx.sync();
  const std::vector<uint16_t> got = hb.get(c), want = from_device<uint16_t>(cast, size_t(rows * I));
  (void)hf.get(c);
  c.same_bits(got.data(), want.data(), got.size() * 2, "swiglu bf16 out vs cast of f32 out");
}


}  // namespace

void add_pair_cases(std::vector<OpCase>& out) {
  struct P {
    int64_t Na, Nb, K;
  };
  // V4-Flash's wq_a and wkv, the tiny fixture's, odd ones
  for (bool fp8 : {true, false})
    for (P p : {P{1024, 512, 4096}, P{128, 64, 256}, P{200, 72, 1008}, P{16, 8, 64}})
      for (int64_t M : {1, 3, 17, 32}) {
        if (!fp8 && p.K % 16) continue;  // NVFP4 blocks of 16
        OpCase c;
        c.family = "linear_pair";
        c.shape = {{"Na", p.Na}, {"Nb", p.Nb}, {"K", p.K}, {"M", M}};
        c.name = case_name(fp8 ? "linear_pair_fp8" : "linear_pair_nvfp4", c.shape);
        c.metric = "bits vs the two launches; ||y-ref||/||ref|| (f32 1e-5, bf16 1e-2)";
        c.tol = 1e-2;
        c.bench = p.Na == 1024;
        c.make = [fp8, p, M](cuda::Context&, const MakeOptions& o) {
          return std::make_unique<PairRun>(fp8, p.Na, p.Nb, p.K, M, o.seed);
        };
        add_case(out, std::move(c));
      }
  add_case(out, check_only_case("linear_pair", "declines", declines));
  add_case(out, check_only_case("linear_pair", "bf16_is_cast_of_f32", bf16_is_cast));
}

}  // namespace cm::optable
