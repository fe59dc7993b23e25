// Shared checks of the GPU linear tests (NVFP4, MXFP4, FP8): the CPU
// reference of a grouped linear for any weight format, and one call of a GPU
// linear for FP32 and BF16 outputs against it. Bounds:
// ||y - ref|| / ||ref|| <= 1e-5 for FP32 output (exact products, only the fp32
// summation order differs) and <= 1e-2 for BF16 output (one bf16 rounding of
// each output); every output finite; canary bytes before, after and between
// the output rows (8 extra columns per row) untouched.
#pragma once
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "backend/cuda/linear/linear.h"
#include "gpu_test_util.h"

namespace cm::gputest {

// Group g's rows [g*N/G, (g+1)*N/G) read x[:, g*K:(g+1)*K] (x is [M, G*K]).
inline std::vector<float> reference_linear(const LinearWeight& w, int groups, const std::vector<float>& x, int64_t M) {
  const int64_t N = w.out_features, K = w.in_features, ng = N / groups;
  std::vector<float> y(size_t(M * N)), xs(size_t(M * K)), ys(size_t(M * ng));
  for (int g = 0; g < groups; ++g) {
    for (int64_t m = 0; m < M; ++m) std::memcpy(&xs[size_t(m * K)], &x[size_t(m * groups * K + g * K)], size_t(K) * 4);
    linear_cpu_rows(w, g * ng, ng, xs.data(), M, ys.data());
    for (int64_t m = 0; m < M; ++m) std::memcpy(&y[size_t(m * N + g * ng)], &ys[size_t(m * ng)], size_t(ng) * 4);
  }
  return y;
}

// run(y, ldy, out) computes the [M, N] output into device memory y with row
// stride ldy; called once per output type and checked against ref.
template <typename Run>
void check_linear_outputs(int64_t M, int64_t N, const std::vector<float>& ref, Run&& run) {
  for (cuda::OutType ot : {cuda::OutType::F32, cuda::OutType::BF16}) {
    const size_t es = ot == cuda::OutType::F32 ? 4 : 2;
    const int64_t ldy = N + 8;  // 8 canary columns after each row
    const size_t pad = 4096, body = size_t(M * ldy) * es;
    cuda::DeviceBuffer dy(pad + body + pad);
    CM_CUDA(cudaMemset(dy.get(), 0xA5, dy.size()));
    run(dy.as<char>() + pad, ldy, ot);
    CM_CUDA(cudaDeviceSynchronize());
    std::vector<uint8_t> raw(dy.size());
    dy.download(raw.data(), raw.size());
    for (size_t i = 0; i < pad; ++i) {
      ASSERT_EQ(raw[i], 0xA5) << "canary before the output overwritten at " << i;
      ASSERT_EQ(raw[pad + body + i], 0xA5) << "canary after the output overwritten at " << i;
    }
    std::vector<float> y(size_t(M * N));
    for (int64_t m = 0; m < M; ++m) {
      const uint8_t* row = raw.data() + pad + size_t(m * ldy) * es;
      for (int64_t n = 0; n < N; ++n) {
        if (es == 4) {
          std::memcpy(&y[size_t(m * N + n)], row + n * 4, 4);
        } else {
          uint16_t b;
          std::memcpy(&b, row + n * 2, 2);
          y[size_t(m * N + n)] = bf16_to_f32(b);
        }
      }
      for (size_t i = size_t(N) * es; i < size_t(ldy) * es; ++i)
        ASSERT_EQ(row[i], 0xA5) << "canary column overwritten in row " << m;
    }
    int64_t nonfinite = 0;
    const double err = rel_error(y, ref, &nonfinite);
    EXPECT_EQ(nonfinite, 0);
    EXPECT_LE(err, ot == cuda::OutType::F32 ? 1e-5 : 1e-2) << (ot == cuda::OutType::F32 ? "f32" : "bf16");
  }
}

}  // namespace cm::gputest
