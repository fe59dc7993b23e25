// Kernel benchmark (see bench_kernels.h) over the op table's cases
// (bench/optable). Every measurement is the median over several launches of
// a CUDA graph holding many back-to-back calls, so launch gaps are those of a
// captured decode step. A case made for the bench holds enough operand sets
// (weights cloned to >= 256 MB) that L2 (60 MB) cannot hold them between
// calls; the same holds for the cuBLAS BF16 baseline of the linears, run in
// the same process on the same shapes. The copy bandwidth is a cudaMemcpy
// device-to-device of 1 GiB (bytes read + written), the ceiling every
// "fraction of copy" refers to; copy_us is a case's weight bytes at it.
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <limits>
#include <map>
#include <tuple>

#include "bench/bench_kernels.h"
#include "bench/optable/op_case.h"
#include "common/error.h"
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

// The cases the options select: the bench selection of the table, or every case --only matches.
std::vector<const optable::OpCase*> select(const KernelBenchOptions& opt) {
  std::vector<const optable::OpCase*> v;
  for (const optable::OpCase& c : optable::all_cases()) {
    if (opt.only.empty() ? (c.bench && !c.check_only) : optable::match_filter(opt.only, c.name)) v.push_back(&c);
  }
  return v;
}

// Median microseconds of cuBLAS BF16 on [M, G*K] x [N, K]^T (G groups), random weights rotated past L2.
double cublas_time(Context& ctx, int64_t M, int64_t N, int64_t K, int64_t G, int repeats) {
  const size_t bf_bytes = size_t(N * K) * 2;
  const int copies = copies_for(double(bf_bytes));
  DeviceBuffer bw(bf_bytes * copies), x(size_t(M * G * K) * 2), y(size_t(M * N) * 2);
  fill_bf16(bw.get(), N * K * copies, 77);
  fill_bf16(x.get(), M * G * K, 5);
  CM_CUDA(cudaDeviceSynchronize());
  auto h = static_cast<cublasHandle_t>(ctx.cublas());
  return time_calls(
      ctx, [&](int i) { cublas_bf16(h, N, K, G, M, bw.as<char>() + bf_bytes * size_t(i), x.as<const uint16_t>(), y.get()); },
      copies, repeats);
}

}  // namespace

std::vector<std::string> list_kernel_cases(const KernelBenchOptions& opt) {
  std::vector<std::string> out;
  for (const optable::OpCase* c : select(opt)) {
    std::string flags;
    if (c->check_only) flags += " check-only";
    if (c->host_check) flags += " host";
    if (c->huge) flags += " huge";
    if (c->bench) flags += " bench";
    out.push_back(c->name + "  " + c->family + "  " + optable::shape_text(*c) + "  [" + c->metric +
                  (c->tol > 0 ? " tol " + std::to_string(c->tol) : "") + ";" + flags + " ]");
  }
  return out;
}

KernelBenchResult run_kernel_bench(const KernelBenchOptions& opt) {
  CM_CU_CHECK(device_count() > 0, "bench kernels: no CUDA device found");
  const std::vector<const optable::OpCase*> cases = select(opt);
  CM_CU_CHECK(!cases.empty(), "bench kernels: no case matches --only '%s' (see --list)", opt.only.c_str());
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
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t>, double> cublas;  // (M, N, K, G) -> us
  for (const optable::OpCase* c : cases) {
    KernelBenchRow r;
    r.name = c->name;
    r.family = c->family;
    r.shape = optable::shape_text(*c);
    r.M = c->param("M");
    r.N = c->param("N");
    r.K = c->param("K");
    r.groups = int(c->param("G", 1));
    const uint64_t seed = opt.seed * 1000003ULL + std::hash<std::string>{}(c->name) % 1000003ULL;
    if (opt.check || c->check_only) {
      if (!opt.check) continue;  // a check-only case has nothing to time
      optable::Checker k;
      if (c->host_check) {
        c->host_check(k);
      } else {
        optable::MakeOptions mo;
        mo.seed = seed;
        std::unique_ptr<optable::OpRun> run = c->make(ctx, mo);
        run->check(ctx, k);
        ctx.sync();
      }
      r.worst = k.worst();
      r.check = k.ok() ? "ok" : k.failures().front();
      res.failed += !k.ok();
      if (c->check_only) {
        res.rows.push_back(r);
        continue;
      }
    }
    optable::MakeOptions mo;
    mo.seed = seed;
    mo.bench = true;
    std::unique_ptr<optable::OpRun> run = c->make(ctx, mo);
    r.us = time_calls(ctx, [&](int i) { run->run(ctx, i); }, run->copies(), opt.repeats);
    r.path = run->path();
    r.bytes = run->bytes();
    r.gbs = r.bytes / (r.us * 1e-6) / 1e9;
    r.frac_copy = r.gbs / res.copy_gbs;
    r.tflops = run->flops() / (r.us * 1e-6) / 1e12;
    r.copy_us = run->weight_bytes() / (res.copy_gbs * 1e9) * 1e6;
    if (c->family.rfind("linear", 0) == 0 && r.M > 0 && r.N > 0 && r.K > 0) {
      const auto key = std::make_tuple(r.M, r.N, r.K, int64_t(r.groups));
      auto it = cublas.find(key);
      if (it == cublas.end()) it = cublas.emplace(key, cublas_time(ctx, r.M, r.N, r.K, r.groups, opt.repeats)).first;
      r.cublas_us = it->second;
      r.cublas_tflops = run->flops() / (r.cublas_us * 1e-6) / 1e12;
      r.speedup = r.cublas_us / r.us;
    }
    res.rows.push_back(r);
  }
  return res;
}

}  // namespace cm::cuda
