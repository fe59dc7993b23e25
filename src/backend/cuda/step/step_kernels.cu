// Small kernels of the CUDA model backend's step (see step_kernels.h). Every
// reduction runs in a fixed order, so the same inputs give the same bits.
#include "backend/cuda/step/step_kernels.h"
#include "backend/cuda/core/cuda_util.h"
#include "backend/cuda/core/ops_device.cuh"
#include "ops/sample.h"

namespace cm::cuda {

namespace {

using dev::bf;
using dev::pdl_wait_and_release;

__device__ __forceinline__ float load(const void* p, bool is_bf16, int64_t i) {
  return is_bf16 ? bf(static_cast<const uint16_t*>(p)[i]) : static_cast<const float*>(p)[i];
}

unsigned blocks_for(int64_t n, int threads) { return unsigned(std::min<int64_t>((n + threads - 1) / threads, 65535 * 8)); }

__global__ void cast_kernel(const float* x, int64_t ldx, int64_t rows, int64_t cols, uint16_t* y, int64_t ldy) {
  pdl_wait_and_release();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < rows * cols; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    y[r * ldy + c] = dev::to_bf(x[r * ldx + c]);
  }
}

__global__ void add_kernel(const float* a, const float* b, int64_t n, float* y) {
  pdl_wait_and_release();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = a[i] + b[i];
}

__global__ void scale_kernel(float* x, int64_t n, float s) {
  pdl_wait_and_release();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] *= s;
}

__global__ void axpy_rows_kernel(const float* a, const float* x, int64_t T, int64_t D, float* y) {
  pdl_wait_and_release();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < T * D; i += int64_t(gridDim.x) * blockDim.x)
    y[i] += a[i / D] * x[i];
}

__global__ void expert_weights_kernel(const int32_t* ids, const float* w, int64_t T, int64_t topk, int64_t E,
                                      float* we) {
  pdl_wait_and_release();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < E * T; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t e = i / T, t = i % T;
    float v = 0.f;
    for (int64_t k = 0; k < topk; ++k)
      if (ids[t * topk + k] == e) v += w[t * topk + k];
    we[i] = v;
  }
}

__global__ void gather_rows_kernel(const float* x, const int32_t* rows, int64_t width, float* y) {
  pdl_wait_and_release();
  const int64_t r = blockIdx.x, src = rows[r];
  for (int64_t c = threadIdx.x; c < width; c += blockDim.x) y[r * width + c] = x[src * width + c];
}

__global__ void mtp_gather_rows_kernel(const float* x, const float* ring, const int32_t* src, int64_t width,
                                       float* y) {
  pdl_wait_and_release();
  const int64_t r = blockIdx.x, s = src[r];
  const float* from = s >= 0 ? x + s * width : ring + (-1 - s) * width;
  for (int64_t c = threadIdx.x; c < width; c += blockDim.x) y[r * width + c] = from[c];
}

__global__ void scatter_rows_kernel(const float* x, const int32_t* dst, int64_t width, float* ring) {
  pdl_wait_and_release();
  const int64_t r = blockIdx.x, d = dst[r];
  if (d < 0) return;
  for (int64_t c = threadIdx.x; c < width; c += blockDim.x) ring[d * width + c] = x[r * width + c];
}

__global__ void add_to_streams_kernel(const float* e, int64_t n, int64_t hc, int64_t D, float* x) {
  pdl_wait_and_release();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n * hc * D; i += int64_t(gridDim.x) * blockDim.x)
    x[i] = e[(i / (hc * D)) * D + i % D] + x[i];
}

__global__ void mtp_advance_kernel(int32_t* tok, const int32_t* status, int64_t n, SampleParams* params,
                                   int32_t* pos, int32_t* out, int32_t* out_status, int32_t* pass) {
  pdl_wait_and_release();
  const int64_t j = *pass;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    out[j * n + i] = tok[i];
    out_status[j * n + i] = status[i];
    if (status[i] != 0) tok[i] = 0;  // (a failed row's −1 is no token to embed; draft() reports the row)
    pos[i] += 1;
    params[i].counter += 1;
  }
  __syncthreads();  // every thread has read *pass
  if (threadIdx.x == 0) *pass = int32_t(j + 1);
}

// One span per block: dst + spans[3b] ← src + spans[3b+1], spans[3b+2] bytes (4-byte words when aligned).
__global__ void copy_spans_kernel(const int64_t* spans, char* dst, const char* src) {
  pdl_wait_and_release();
  const int64_t* sp = spans + 3 * int64_t(blockIdx.x);
  char* d = dst + sp[0];
  const char* s = src + sp[1];
  const int64_t bytes = sp[2];
  if (((sp[0] | sp[1] | bytes) & 3) == 0) {
    for (int64_t i = threadIdx.x; i < bytes / 4; i += blockDim.x)
      reinterpret_cast<uint32_t*>(d)[i] = reinterpret_cast<const uint32_t*>(s)[i];
  } else {
    for (int64_t i = threadIdx.x; i < bytes; i += blockDim.x) d[i] = s[i];
  }
}

__global__ void gather_scores_kernel(const float* score, int64_t ld, const int32_t* idx, int64_t T, int64_t topk,
                                     float* out) {
  pdl_wait_and_release();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < T * topk; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / topk;
    const int32_t e = idx[i];
    out[i] = e >= 0 ? score[t * ld + e] : 0.f;
  }
}

// One CTA per (row, intermediate); rows whose bytes are 16-byte aligned are read 16 bytes at a time
// (a 64 x 512 bf16 row in 16 loads per thread instead of 128): NaN/Inf = all exponent bits set.
__global__ void count_non_finite_kernel(const NonFiniteBatch b) {
  pdl_wait_and_release();
  __shared__ float tmp[32];
  const int64_t r = blockIdx.x;
  const int e = blockIdx.y;
  const int64_t width = b.width[e];
  const bool h = b.bf16[e];
  const int64_t bytes = width * (h ? 2 : 4);
  const char* row = static_cast<const char*>(b.x[e]) + r * bytes;
  int bad = 0;
  if (bytes % 16 == 0 && reinterpret_cast<uintptr_t>(row) % 16 == 0) {
    const uint4* v = reinterpret_cast<const uint4*>(row);
    // Unrolled so that a thread's loads are in flight together (a 64 KiB row: 16 per thread; one at a
    // time the one-token step's count took ~10 µs a layer).
#pragma unroll 8
    for (int64_t i = threadIdx.x; i < bytes / 16; i += blockDim.x) {
      const uint4 q = v[i];
      const uint32_t w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if (h)
          bad += ((w[j] & 0x7f80u) == 0x7f80u) + ((w[j] & 0x7f800000u) == 0x7f800000u);
        else
          bad += (w[j] & 0x7f800000u) == 0x7f800000u;
      }
    }
  } else {
    for (int64_t c = threadIdx.x; c < width; c += blockDim.x) bad += isfinite(load(b.x[e], h, r * width + c)) ? 0 : 1;
  }
  const float total = dev::block_sum(float(bad), tmp);
  if (threadIdx.x == 0) b.out[e][r] = int32_t(total);
}

}  // namespace

void cast_f32_bf16(Context& ctx, const float* x, int64_t ldx, int64_t rows, int64_t cols, uint16_t* y, int64_t ldy) {
  if (rows <= 0 || cols <= 0) return;
  launch_kernel(ctx, cast_kernel, dim3(blocks_for(rows * cols, 256)), dim3(256), 0, "cast_kernel", x, ldx, rows, cols,
                y, ldy);
}

void add_f32(Context& ctx, const float* a, const float* b, int64_t n, float* y) {
  if (n <= 0) return;
  launch_kernel(ctx, add_kernel, dim3(blocks_for(n, 256)), dim3(256), 0, "add_kernel", a, b, n, y);
}

void scale_f32(Context& ctx, float* x, int64_t n, float s) {
  if (n <= 0) return;
  launch_kernel(ctx, scale_kernel, dim3(blocks_for(n, 256)), dim3(256), 0, "scale_kernel", x, n, s);
}


void axpy_rows(Context& ctx, const float* a, const float* x, int64_t T, int64_t D, float* y) {
  if (T * D <= 0) return;
  launch_kernel(ctx, axpy_rows_kernel, dim3(blocks_for(T * D, 256)), dim3(256), 0, "axpy_rows_kernel", a, x, T, D, y);
}

void moe_expert_weights(Context& ctx, const int32_t* ids, const float* w, int64_t T, int64_t topk, int64_t E,
                        float* we) {
  if (T * E <= 0) return;
  launch_kernel(ctx, expert_weights_kernel, dim3(blocks_for(T * E, 256)), dim3(256), 0, "expert_weights_kernel", ids,
                w, T, topk, E, we);
}

void gather_rows(Context& ctx, const float* x, const int32_t* rows, int64_t R, int64_t width, float* y) {
  if (R <= 0) return;
  launch_kernel(ctx, gather_rows_kernel, dim3(unsigned(R)), dim3(256), 0, "gather_rows_kernel", x, rows, width, y);
}

void mtp_gather_rows(Context& ctx, const float* x, const float* ring, const int32_t* src, int64_t n, int64_t width,
                     float* y) {
  if (n <= 0) return;
  launch_kernel(ctx, mtp_gather_rows_kernel, dim3(unsigned(n)), dim3(256), 0, "mtp_gather_rows_kernel", x, ring, src,
                width, y);
}

void scatter_rows(Context& ctx, const float* x, const int32_t* dst, int64_t n, int64_t width, float* ring) {
  if (n <= 0) return;
  launch_kernel(ctx, scatter_rows_kernel, dim3(unsigned(n)), dim3(256), 0, "scatter_rows_kernel", x, dst, width, ring);
}

void add_to_streams(Context& ctx, const float* e, int64_t n, int64_t hc, int64_t D, float* x) {
  if (n * hc * D <= 0) return;
  launch_kernel(ctx, add_to_streams_kernel, dim3(blocks_for(n * hc * D, 256)), dim3(256), 0, "add_to_streams_kernel",
                e, n, hc, D, x);
}

void mtp_advance(Context& ctx, int32_t* tok, const int32_t* status, int64_t n, void* params, int32_t* pos,
                 int32_t* out, int32_t* out_status, int32_t* pass) {
  launch_kernel(ctx, mtp_advance_kernel, dim3(1), dim3(256), 0, "mtp_advance_kernel", tok, status, n,
                static_cast<SampleParams*>(params), pos, out, out_status, pass);
}

void copy_spans(Context& ctx, const int64_t* spans, int64_t n, char* dst, const char* src) {
  for (int64_t b = 0; b < n; b += 65535)
    launch_kernel(ctx, copy_spans_kernel, dim3(unsigned(std::min<int64_t>(n - b, 65535))), dim3(256), 0,
                  "copy_spans_kernel", spans + 3 * b, dst, src);
}

void gather_scores(Context& ctx, const float* score, int64_t ld, const int32_t* idx, int64_t T, int64_t topk,
                   float* out) {
  if (T * topk <= 0) return;
  launch_kernel(ctx, gather_scores_kernel, dim3(blocks_for(T * topk, 256)), dim3(256), 0, "gather_scores_kernel",
                score, ld, idx, T, topk, out);
}

void count_non_finite(Context& ctx, const NonFiniteBatch& b, int64_t rows) {
  CM_CU_CHECK(b.count >= 0 && b.count <= NonFiniteBatch::kMax, "count_non_finite: %d intermediates in a batch", b.count);
  if (rows <= 0 || b.count == 0) return;
  // 1024 threads when a row is 32 KiB or more (a one-token step's q and attention output: 64 x 512),
  // so that one CTA's loads of it are in flight together.
  int64_t widest = 0;
  for (int e = 0; e < b.count; ++e) widest = std::max<int64_t>(widest, b.width[e] * (b.bf16[e] ? 2 : 4));
  launch_kernel(ctx, count_non_finite_kernel, dim3(unsigned(rows), unsigned(b.count)),
                dim3(widest >= 32768 ? 1024u : 256u), 0, "count_non_finite_kernel", b);
}

}  // namespace cm::cuda
