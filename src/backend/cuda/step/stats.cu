// Device tensor statistics (see ops/stats.h): one CTA of 1024 threads walks
// the segments; per-thread partials are combined warp by warp, then across
// warps in warp order (deterministic).
#include <algorithm>

#include "backend/cuda/core/cuda_util.h"
#include "backend/cuda/core/ops_device.cuh"
#include "ops/stats.h"

namespace cm {

namespace {

constexpr int kThreads = 1024;

__device__ __forceinline__ float load(const float* x, int64_t i) { return x[i]; }
__device__ __forceinline__ float load(const uint16_t* x, int64_t i) { return cuda::dev::bf(x[i]); }

template <typename T>
__global__ void __launch_bounds__(kThreads) stats_kernel(const T* x, int64_t rows, int64_t len, int64_t stride,
                                                        DeviceTensorStats* out) {
  cuda::dev::pdl_wait_and_release();
  __shared__ float s_amax[32];
  __shared__ double s_sum[32];
  __shared__ long long s_cnt[3][32];
  float amax = 0.f;
  double sum = 0.0;
  long long nan = 0, inf = 0, cnt = 0;
  const int64_t n = rows * len;
  for (int64_t k = threadIdx.x; k < n; k += kThreads) {
    const float v = load(x, (k / len) * stride + k % len);
    if (isnan(v)) {
      ++nan;
    } else if (isinf(v)) {
      ++inf;
    } else {
      amax = fmaxf(amax, fabsf(v));
      sum += double(v);
      ++cnt;
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    sum += __shfl_xor_sync(0xffffffffu, sum, o);
    nan += __shfl_xor_sync(0xffffffffu, nan, o);
    inf += __shfl_xor_sync(0xffffffffu, inf, o);
    cnt += __shfl_xor_sync(0xffffffffu, cnt, o);
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) {
    s_amax[warp] = amax;
    s_sum[warp] = sum;
    s_cnt[0][warp] = nan;
    s_cnt[1][warp] = inf;
    s_cnt[2][warp] = cnt;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    DeviceTensorStats r;
    for (int w = 0; w < kThreads / 32; ++w) {
      r.amax = fmaxf(r.amax, s_amax[w]);
      r.sum += s_sum[w];
      r.nan += s_cnt[0][w];
      r.inf += s_cnt[1][w];
      r.count += s_cnt[2][w];
    }
    *out = r;
  }
}

template <typename T>
void stats_launch(cuda::Context& ctx, const T* x, int64_t rows, int64_t len, int64_t stride, DeviceTensorStats* out) {
  CM_CU_CHECK(rows >= 0 && len >= 0 && (rows <= 1 || stride >= len),
              "tensor_stats_cuda: %lld segments of %lld values %lld apart", (long long)rows, (long long)len,
              (long long)stride);
  CM_CU_CHECK(len > 0 || rows == 0, "tensor_stats_cuda: empty segments");
  cuda::launch_kernel(ctx, stats_kernel<T>, dim3(1), dim3(kThreads), 0, "stats_kernel", x, rows,
                      std::max<int64_t>(len, 1), stride, out);
}

}  // namespace

void tensor_stats_cuda(cuda::Context& ctx, const float* x, int64_t rows, int64_t len, int64_t stride,
                       DeviceTensorStats* out) {
  stats_launch(ctx, x, rows, len, stride, out);
}

void tensor_stats_cuda(cuda::Context& ctx, const uint16_t* x_bf16, int64_t rows, int64_t len, int64_t stride,
                       DeviceTensorStats* out) {
  stats_launch(ctx, x_bf16, rows, len, stride, out);
}

}  // namespace cm
