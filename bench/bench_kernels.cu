// Kernel benchmark (see bench_kernels.h). Every measurement is the median
// over several launches of a CUDA graph holding many back-to-back calls, so
// launch gaps are those of a captured decode step. Weights are rotated over
// enough copies (>= 256 MB) that L2 (60 MB) cannot hold them between calls;
// the same holds for the cuBLAS BF16 baseline, run in the same process on the
// same shapes. The copy bandwidth is a cudaMemcpy device-to-device of 1 GiB
// (bytes read + written), the ceiling every "fraction of copy" refers to.
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <limits>
#include <random>
#include <set>
#include <type_traits>

#include "bench/bench_kernels.h"
#include "backend/cuda/linear/linear.h"
#include "backend/cuda/moe/moe.h"
#include "backend/cuda/core/cuda_util.h"

namespace cm::cuda {

namespace {

__global__ void fill_bf16_kernel(__nv_bfloat16* p, int64_t n, uint64_t seed) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    uint64_t x = (seed + uint64_t(i)) * 0x9E3779B97F4A7C15ULL;
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ULL;
    x ^= x >> 29;
    p[i] = __float2bfloat16_rn(float(int(x & 0xffff) - 32768) / 32768.0f);
  }
}

__global__ void empty_kernel() {}

void fill_bf16(void* p, int64_t n, uint64_t seed) {
  fill_bf16_kernel<<<1024, 256>>>(static_cast<__nv_bfloat16*>(p), n, seed);
  CM_CUDA_LAUNCH("fill_bf16_kernel");
}

struct Events {
  cudaEvent_t a = nullptr, b = nullptr;
  Events() {
    CM_CUDA(cudaEventCreate(&a));
    CM_CUDA(cudaEventCreate(&b));
  }
  ~Events() {
    cudaEventDestroy(a);
    cudaEventDestroy(b);
  }
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median microseconds per call of fn(i), i cycling over `copies` operand sets.
template <typename F>
double time_calls(Context& ctx, F&& fn, int copies, int repeats) {
  cudaStream_t st = ctx.stream();
  Events ev;
  fn(0);  // warm-up: lazy allocations happen outside the capture
  ctx.sync();
  CM_CUDA(cudaEventRecord(ev.a, st));
  for (int i = 0; i < copies; ++i) fn(i);
  CM_CUDA(cudaEventRecord(ev.b, st));
  CM_CUDA(cudaEventSynchronize(ev.b));
  float ms = 0;
  CM_CUDA(cudaEventElapsedTime(&ms, ev.a, ev.b));
  const double est_us = std::max(1e-3, 1000.0 * ms / copies);
  int reps = int(std::clamp(4000.0 / est_us, 1.0, 3000.0));
  reps = std::max(reps, std::min(copies, 3000));

  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  CM_CUDA(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  try {
    for (int i = 0; i < reps; ++i) fn(i % copies);
  } catch (...) {
    cudaStreamEndCapture(st, &graph);
    if (graph) cudaGraphDestroy(graph);
    throw;
  }
  CM_CUDA(cudaStreamEndCapture(st, &graph));
  CM_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  CM_CUDA(cudaGraphLaunch(exec, st));
  ctx.sync();
  std::vector<double> t;
  for (int r = 0; r < repeats; ++r) {
    CM_CUDA(cudaEventRecord(ev.a, st));
    CM_CUDA(cudaGraphLaunch(exec, st));
    CM_CUDA(cudaEventRecord(ev.b, st));
    CM_CUDA(cudaEventSynchronize(ev.b));
    CM_CUDA(cudaEventElapsedTime(&ms, ev.a, ev.b));
    t.push_back(1000.0 * ms / reps);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  return median(t);
}

double copy_bandwidth(Context& ctx) {
  const size_t bytes = size_t(1) << 30;
  DeviceBuffer a(bytes), b(bytes);
  CM_CUDA(cudaMemsetAsync(a.get(), 1, bytes, ctx.stream()));
  Events ev;
  std::vector<double> t;
  for (int r = 0; r < 12; ++r) {
    CM_CUDA(cudaEventRecord(ev.a, ctx.stream()));
    CM_CUDA(cudaMemcpyAsync(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice, ctx.stream()));
    CM_CUDA(cudaEventRecord(ev.b, ctx.stream()));
    CM_CUDA(cudaEventSynchronize(ev.b));
    float ms = 0;
    CM_CUDA(cudaEventElapsedTime(&ms, ev.a, ev.b));
    if (r >= 2) t.push_back(ms);
  }
  return 2.0 * double(bytes) / (median(t) * 1e-3) / 1e9;
}

struct Shape {
  const char* name;
  int64_t N, K;
  int groups;
};

// V4-Flash's linear shapes (out N, in K): expert w1/w3, expert w2, attention
// wq_a, wq_b, wkv, grouped wo_a (8 x 4096->1024), wo_b, and the LM head.
const Shape kShapes[] = {
    {"expert gate/up 4096->2048", 2048, 4096, 1}, {"expert down 2048->4096", 4096, 2048, 1},
    {"attn q_a 4096->1024", 1024, 4096, 1},       {"attn q_b 1024->32768", 32768, 1024, 1},
    {"attn kv 4096->512", 512, 4096, 1},          {"attn wo_a 8x 4096->1024", 8192, 4096, 8},
    {"attn wo_b 8192->4096", 4096, 8192, 1},      {"head 4096->129280", 129280, 4096, 1},
};

// y[M, N] = x[M, G*K] * W^T for a BF16 weight of G groups [N/G, K] (cuBLAS, FP32 compute): the baseline.
void cublas_bf16(cublasHandle_t h, int64_t N, int64_t K, int64_t G, int64_t M, const void* w, const uint16_t* x,
                 void* y) {
  const float alpha = 1.f, beta = 0.f;
  const int64_t ng = N / G;
  check_cublas(cublasGemmStridedBatchedEx(h, CUBLAS_OP_T, CUBLAS_OP_N, int(ng), int(M), int(K), &alpha, w, CUDA_R_16BF,
                                          int(K), ng * K, x, CUDA_R_16BF, int(G * K), K, &beta, y, CUDA_R_16BF, int(N),
                                          ng, int(G), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               "cublasGemmStridedBatchedEx");
}

int copies_for(double bytes) { return int(std::clamp(std::ceil(256e6 / bytes), 1.0, 128.0)); }

// A linear row's identifying columns.
KernelBenchRow linear_row(const char* name, int64_t M, int64_t N, int64_t K, int groups) {
  KernelBenchRow r;
  r.kind = "linear";
  r.name = name;
  r.M = M;
  r.N = N;
  r.K = K;
  r.groups = groups;
  return r;
}

// Derived columns of a row from its measured time (r.us), the bytes it must
// move and its flops.
void set_rates(KernelBenchRow& r, double bytes, double flop, double copy_gbs) {
  r.bytes = bytes;
  r.gbs = bytes / (r.us * 1e-6) / 1e9;
  r.frac_copy = r.gbs / copy_gbs;
  r.tflops = flop / (r.us * 1e-6) / 1e12;
}

void bench_linear(Context& ctx, const KernelBenchOptions& opt, const Shape& s, double copy_gbs, KernelBenchResult& res) {
  const int64_t N = s.N, K = s.K, G = s.groups, KX = G * K;
  const int64_t mmax = *std::max_element(opt.ms.begin(), opt.ms.end());
  std::vector<DeviceLinear> ws;
  ws.push_back(random_nvfp4(N, K, 1000 + N + K, int(G)));
  const int wcopies = copies_for(double(ws[0].device_bytes()));
  for (int i = 1; i < wcopies; ++i) ws.push_back(random_nvfp4(N, K, 1000 + N + K + i, int(G)));
  const size_t bf_bytes = size_t(N * K) * 2;
  const int bcopies = copies_for(double(bf_bytes));
  DeviceBuffer bw(bf_bytes * bcopies);
  fill_bf16(bw.get(), N * K * bcopies, 77);
  DeviceBuffer x(size_t(mmax * KX) * 2), y(size_t(mmax * N) * 2);
  fill_bf16(x.get(), mmax * KX, 5);
  CM_CUDA(cudaDeviceSynchronize());
  auto h = static_cast<cublasHandle_t>(ctx.cublas());
  double copy_us = 0;
  for (int64_t M : opt.ms) {
    const uint16_t* xp = x.as<const uint16_t>();
    const double flop = 2.0 * double(M) * double(N) * double(K);
    if (M == opt.ms.front()) {
      // a plain copy of the weight bytes (half to half) through the same timing: what the size alone costs
      const size_t half = ws[0].data.size() / 2;
      copy_us = time_calls(
          ctx,
          [&](int i) {
            char* d = ws[size_t(i)].data.as<char>();
            CM_CUDA(cudaMemcpyAsync(d + half, d, half, cudaMemcpyDeviceToDevice, ctx.stream()));
          },
          wcopies, opt.repeats);
    }
    const double cublas_us = time_calls(
        ctx, [&](int i) { cublas_bf16(h, N, K, G, M, bw.as<char>() + bf_bytes * size_t(i), xp, y.get()); }, bcopies,
        opt.repeats);
    // (kernel, decode_max_m): the default first; M > 64 also the other of wgmma and dequant + cuBLAS;
    // 16 < M <= 64 also the wgmma kernel in place of the decode kernel
    std::vector<std::pair<PrefillKernel, int64_t>> kernels{{PrefillKernel::Auto, 64}};
    if (M > 64 && wgmma_nvfp4_supported(ws[0], M))  // the path Auto did not take
      kernels.push_back({std::string(linear_nvfp4_path(ws[0], M)) == "wgmma" ? PrefillKernel::DequantCublas
                                                                             : PrefillKernel::Wgmma,
                         64});
    if (M > 16 && M <= 64 && wgmma_nvfp4_supported(ws[0], M)) kernels.push_back({PrefillKernel::Wgmma, 0});
    // M > 64: the batch-invariant pair the model chooses between by M (same
    // bits): the mma.sync prefill kernel and 32-row slices of the decode kernel
    if (M > 64) {
      kernels.push_back({PrefillKernel::MmaTiles, 64});
      kernels.push_back({PrefillKernel::Auto, std::numeric_limits<int64_t>::max()});
    }
    for (const auto& kd : kernels) {
      const PrefillKernel pk = kd.first;
      const int64_t dmax = kd.second;
      KernelBenchRow r = linear_row(s.name, M, N, K, int(G));
      r.path = linear_nvfp4_path(ws[0], M, dmax, pk);
      r.us = time_calls(
          ctx, [&](int i) { linear_nvfp4(ctx, ws[size_t(i)], xp, M, KX, y.get(), N, OutType::BF16, dmax, pk); },
          wcopies, opt.repeats);
      set_rates(r, double(ws[0].device_bytes()) + double(M * KX) * 2 + double(M * N) * 2, flop, copy_gbs);
      r.copy_us = copy_us;
      r.cublas_us = cublas_us;
      r.cublas_tflops = flop / (cublas_us * 1e-6) / 1e12;
      r.speedup = cublas_us / r.us;
      res.rows.push_back(r);
    }
  }
}

void bench_moe(Context& ctx, const KernelBenchOptions& opt, double copy_gbs, KernelBenchResult& res) {
  const int64_t hidden = 4096, inter = 2048;
  const int E = 256, topk = 6;
  DeviceExperts ex = random_experts(hidden, inter, 0, E, 4242);
  const int tmax = *std::max_element(opt.moe_tokens.begin(), opt.moe_tokens.end());
  MoeScratch scratch(ex, tmax, topk);
  DeviceBuffer x(size_t(tmax) * hidden * 2), y(size_t(tmax) * hidden * 4);
  fill_bf16(x.get(), tmax * hidden, 9);
  CM_CUDA(cudaDeviceSynchronize());
  std::mt19937 rng(1234);
  for (int T : opt.moe_tokens) {
    const int copies = 8;  // different routings, so the 6 experts of T=1 are not L2-resident
    std::vector<DeviceBuffer> ids, wts;
    double touched = 0;
    for (int c = 0; c < copies; ++c) {
      std::vector<int32_t> hid(size_t(T) * topk);
      std::vector<float> hw(hid.size());
      std::set<int> distinct;
      for (int t = 0; t < T; ++t) {
        std::set<int> pick;
        while (int(pick.size()) < topk) pick.insert(int(rng() % E));
        int k = 0;
        for (int e : pick) {
          hid[size_t(t) * topk + k] = e;
          hw[size_t(t) * topk + k] = 0.1f + float(rng() % 1000) / 1000.0f;
          distinct.insert(e);
          ++k;
        }
      }
      touched += double(distinct.size()) / copies;
      ids.emplace_back(hid.size() * 4);
      ids.back().upload(hid.data(), hid.size() * 4);
      wts.emplace_back(hw.size() * 4);
      wts.back().upload(hw.data(), hw.size() * 4);
    }
    // Both kernel families at every T (the threshold kMoePrefillMinTokens is a
    // speed choice only: they give the same bits), marked with the one moe_nvfp4 picks.
    for (MoePath path : {MoePath::decode, MoePath::prefill}) {
      const bool picked = (path == MoePath::prefill) == (T >= kMoePrefillMinTokens);
      KernelBenchRow r;
      r.kind = "moe";
      r.name = "moe 6 of 256, 4096/2048";
      r.path = std::string(path == MoePath::prefill ? "route + prefill gate/up + down" : "route + gate/up + down") +
               (picked ? " [picked]" : "");
      r.M = T;
      r.N = hidden;
      r.K = inter;
      r.experts_touched = int64_t(touched + 0.5);
      r.us = time_calls(
          ctx,
          [&](int i) {
            moe_nvfp4(ctx, ex, scratch, x.as<const uint16_t>(), T, ids[size_t(i)].as<const int32_t>(),
                      wts[size_t(i)].as<const float>(), y.as<float>(), path);
          },
          copies, opt.repeats);
      set_rates(r, touched * double(ex.expert_bytes()) + double(T) * hidden * (2 + 4),
                2.0 * 3 * double(T) * topk * double(hidden * inter), copy_gbs);
      res.rows.push_back(r);
    }
  }
}

// DeepSeek's release formats on the shapes they hold in V4-Flash: FP8 128x128
// blocks (E8M0 scales) for attention, MXFP4 for the routed experts (through
// the NVFP4 kernels after the repack). Weights are real uploads of random
// host weights, cloned on the device for the L2 rotation. bytes = device bytes
// of the weight (packed FP8 + f32 block scales; for MXFP4 the NVFP4 layout,
// one scale byte per 16) + activations + output. The cuBLAS BF16 baseline and
// the NVFP4 path label are taken from the NVFP4 row of the same shape and M
// when this run measured it (0 = not run); FP8 shapes without one time cuBLAS
// here. FP8 at M > 64 gets three rows: the default path (dequant + cuBLAS),
// the decode kernel over 32-token slices and the prefill kernel (both with
// the decode bits); "[engine]" marks the one the engine runs (run_linear).
void bench_release_formats(Context& ctx, const KernelBenchOptions& opt, double copy_gbs, KernelBenchResult& res) {
  struct Rel {
    const char* name;
    bool fp8;
    int64_t N, K;
    int groups;
  };
  const Rel shapes[] = {{"fp8 q_a 4096->1024", true, 1024, 4096, 1},
                        {"fp8 q_b 1024->32768", true, 32768, 1024, 1},
                        {"fp8 wo_a 8x 4096->1024", true, 8192, 4096, 8},
                        {"fp8 wo_b 8192->4096", true, 4096, 8192, 1},
                        {"fp8 shared w1/w3 4096->2048", true, 2048, 4096, 1},
                        {"mxfp4 gate/up 4096->2048", false, 2048, 4096, 1},
                        {"mxfp4 down 2048->4096", false, 4096, 2048, 1}};
  const int64_t mmax = *std::max_element(opt.ms.begin(), opt.ms.end());
  auto clone = [](const DeviceBuffer& b) {
    DeviceBuffer c(b.size());
    CM_CUDA(cudaMemcpy(c.get(), b.get(), b.size(), cudaMemcpyDeviceToDevice));
    return c;
  };
  auto clone_linear = [&](const auto& o) {  // DeviceFp8Linear or DeviceLinear
    std::decay_t<decltype(o)> c;
    c.name = o.name;
    c.N = o.N;
    c.K = o.K;
    c.row_blocks = o.row_blocks;
    c.chunks = o.chunks;
    c.groups = o.groups;
    if constexpr (std::is_same_v<decltype(c), DeviceFp8Linear>) {
      c.scale_rows = o.scale_rows;
      c.scale_cols = o.scale_cols;
      c.pow2_scales = o.pow2_scales;
    } else {
      c.scale_2 = o.scale_2;
    }
    c.data = clone(o.data);
    c.scales = clone(o.scales);
    return c;
  };
  for (const Rel& s : shapes) {
    if (!opt.only.empty() && std::string(s.name).find(opt.only) == std::string::npos) continue;
    const int64_t N = s.N, K = s.K, KX = K * s.groups;
    std::mt19937_64 rng(uint64_t(N * 7 + K));
    LinearWeight w;
    w.name = s.name;
    w.out_features = N;
    w.in_features = K;
    if (s.fp8) {
      w.format = WeightFormat::FP8_BLOCK;
      w.owned.resize(size_t(N * K));
      for (auto& b : w.owned) b = uint8_t(rng() & 0xF7);  // never the NaN codes 0x7F/0xFF
      w.scale_rows = (N + 127) / 128;
      w.scale_cols = (K + 127) / 128;
      w.owned_scale.assign(size_t(w.scale_rows * w.scale_cols), uint8_t(127 - 10));
    } else {
      w.format = WeightFormat::MXFP4;
      w.owned.resize(size_t(N * K / 2));
      for (auto& b : w.owned) b = uint8_t(rng());
      w.scale_rows = N;
      w.scale_cols = K / 32;
      w.owned_scale.resize(size_t(N * K / 32));
      for (auto& e : w.owned_scale) e = uint8_t(118 + rng() % 6);
    }
    w.data = w.owned.data();
    w.scale = w.owned_scale.data();
    w.scale_dtype = DType::F8_E8M0;
    std::vector<DeviceFp8Linear> f8;
    std::vector<DeviceLinear> f4;
    if (s.fp8) f8.push_back(upload_fp8(w, s.groups));
    else f4.push_back(upload_nvfp4(w));
    const size_t data_bytes = s.fp8 ? f8[0].data.size() : f4[0].data.size();
    const double wbytes = double(s.fp8 ? f8[0].device_bytes() : f4[0].device_bytes());
    const int copies = copies_for(wbytes);
    for (int i = 1; i < copies; ++i) {  // same bytes at other addresses
      if (s.fp8) f8.push_back(clone_linear(f8[0]));
      else f4.push_back(clone_linear(f4[0]));
    }
    DeviceBuffer x(size_t(mmax * KX) * 2), y(size_t(mmax * N) * 2);
    fill_bf16(x.get(), mmax * KX, 5);
    CM_CUDA(cudaDeviceSynchronize());
    const uint16_t* xp = x.as<const uint16_t>();
    DeviceBuffer bw;  // BF16 weights for the cuBLAS baseline, filled when first needed
    const size_t bf_bytes = size_t(N * K) * 2;
    const int bcopies = copies_for(double(bf_bytes));
    const size_t half = data_bytes / 2;
    const double copy_us = time_calls(
        ctx,
        [&](int i) {
          char* d = (s.fp8 ? f8[size_t(i)].data : f4[size_t(i)].data).as<char>();
          CM_CUDA(cudaMemcpyAsync(d + half, d, half, cudaMemcpyDeviceToDevice, ctx.stream()));
        },
        copies, opt.repeats);
    for (int64_t M : opt.ms) {
      const KernelBenchRow* nv = nullptr;  // the NVFP4 row of this shape and M, if measured
      for (const KernelBenchRow& o : res.rows)
        if (o.kind == "linear" && o.N == N && o.K == K && o.M == M && o.groups == s.groups &&
            o.name.rfind("fp8", 0) != 0 && o.name.rfind("mxfp4", 0) != 0) {
          nv = &o;  // the first one: the default path's row
          break;
        }
      const double flop = 2.0 * double(M) * double(N) * double(K);
      double cublas_us = nv ? nv->cublas_us : 0;
      if (s.fp8 && cublas_us <= 0) {
        if (bw.size() == 0) {
          bw.alloc(bf_bytes * bcopies);
          fill_bf16(bw.get(), N * K * bcopies, 77);
        }
        auto h = static_cast<cublasHandle_t>(ctx.cublas());
        cublas_us = time_calls(
            ctx, [&](int i) { cublas_bf16(h, N, K, s.groups, M, bw.as<char>() + bf_bytes * size_t(i), xp, y.get()); },
            bcopies, opt.repeats);
      }
      // (decode_max_m, prefill) of each FP8 row: the default first
      std::vector<std::pair<int64_t, Fp8Prefill>> variants{{64, Fp8Prefill::Fast}};
      if (s.fp8 && M > 64) {
        variants.push_back({std::numeric_limits<int64_t>::max(), Fp8Prefill::Fast});
        variants.push_back({0, Fp8Prefill::Exact});
      }
      for (const auto& variant : variants) {
        const int64_t dmax = variant.first;
        const Fp8Prefill pf = variant.second;
        KernelBenchRow r = linear_row(s.name, M, N, K, s.groups);
        if (s.fp8) {
          r.path = linear_fp8(ctx, f8[0], xp, M, KX, y.get(), N, OutType::BF16, dmax, pf);
          if (M > 32 && r.path == kFp8PathDecode) r.path += " (32-token slices)";
          const bool engine_prefill = M >= kFp8PrefillMinM;
          if (pf == Fp8Prefill::Exact ? engine_prefill : (!engine_prefill && (M <= 64) == (dmax == 64)))
            r.path += " [engine]";
        } else {
          r.path = linear_nvfp4_path(f4[0], M);
        }
        r.us = time_calls(
            ctx,
            [&](int i) {
              if (s.fp8) linear_fp8(ctx, f8[size_t(i)], xp, M, KX, y.get(), N, OutType::BF16, dmax, pf);
              else linear_nvfp4(ctx, f4[size_t(i)], xp, M, K, y.get(), N, OutType::BF16);
            },
            copies, opt.repeats);
        set_rates(r, wbytes + double(M * KX) * 2 + double(M * N) * 2, flop, copy_gbs);
        r.copy_us = copy_us;
        if (cublas_us > 0) {
          r.cublas_us = cublas_us;
          r.cublas_tflops = flop / (cublas_us * 1e-6) / 1e12;
          r.speedup = r.cublas_us / r.us;
        }
        res.rows.push_back(r);
      }
    }
  }
}

}  // namespace

KernelBenchResult run_kernel_bench(const KernelBenchOptions& opt) {
  CM_CU_CHECK(device_count() > 0, "bench kernels: no CUDA device found");
  CM_CU_CHECK(!opt.ms.empty(), "bench kernels: no M values given");
  Context ctx(0, opt.pdl);
  cudaDeviceProp prop{};
  CM_CUDA(cudaGetDeviceProperties(&prop, 0));
  KernelBenchResult res;
  res.gpu = prop.name;
  res.copy_gbs = copy_bandwidth(ctx);
  res.empty_us = time_calls(
      ctx,
      [&](int) {
        empty_kernel<<<1, 32, 0, ctx.stream()>>>();
        CM_CUDA_LAUNCH("empty_kernel");
      },
      1, opt.repeats);
  for (const Shape& s : kShapes) {
    if (!opt.only.empty() && std::string(s.name).find(opt.only) == std::string::npos) continue;
    bench_linear(ctx, opt, s, res.copy_gbs, res);
  }
  bench_release_formats(ctx, opt, res.copy_gbs, res);
  if (!opt.moe_tokens.empty() && (opt.only.empty() || std::string("moe").find(opt.only) != std::string::npos))
    bench_moe(ctx, opt, res.copy_gbs, res);
  return res;
}

}  // namespace cm::cuda
