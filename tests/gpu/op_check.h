// Helpers of the GPU op tests (each GPU op against its CPU op):
//  - Guarded<T>: a device output with canary zones before and after it; the
//    output itself starts as NaN bytes, so an element the kernel forgot stays
//    non-finite and fails the comparison, and a write outside the output
//    breaks a canary;
//  - to_device: uploads a host vector;
//  - max_rel: the error metric max|gpu − ref| / max|ref| (non-finite counts
//    as an infinite error), printed per op and shape for the report.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "backend/cuda/core/cuda_util.h"
#include "common/numeric.h"
#include "gpu_test_util.h"
#include "model/config.h"
#include "ops/rope.h"

namespace cm::gputest {

template <typename T>
cuda::DeviceBuffer to_device(const std::vector<T>& v) {
  cuda::DeviceBuffer b(std::max<size_t>(v.size(), 1) * sizeof(T));
  if (!v.empty()) b.upload(v.data(), v.size() * sizeof(T));
  return b;
}

template <typename T>
std::vector<T> from_device(const cuda::DeviceBuffer& b, size_t n) {
  std::vector<T> v(n);
  if (n) b.download(v.data(), n * sizeof(T));
  return v;
}

template <typename T>
class Guarded {
 public:
  static constexpr size_t kGuardBytes = 4096;
  static constexpr uint8_t kCanary = 0xA5;
  explicit Guarded(size_t n) : n_(n), buf_(n * sizeof(T) + 2 * kGuardBytes) {
    CM_CUDA(cudaMemset(buf_.get(), kCanary, buf_.size()));
    CM_CUDA(cudaMemset(ptr(), 0xFF, n * sizeof(T)));  // NaN for f32 and bf16, -1 for int32
  }
  T* ptr() const { return reinterpret_cast<T*>(static_cast<char*>(buf_.get()) + kGuardBytes); }
  // The output; fails the test when a canary byte changed.
  std::vector<T> get() const {
    std::vector<uint8_t> all(buf_.size());
    buf_.download(all.data(), all.size());
    size_t bad = 0;
    for (size_t i = 0; i < kGuardBytes; ++i) bad += all[i] != kCanary;
    for (size_t i = kGuardBytes + n_ * sizeof(T); i < all.size(); ++i) bad += all[i] != kCanary;
    EXPECT_EQ(bad, 0u) << "kernel wrote outside its output (" << bad << " canary bytes changed)";
    std::vector<T> v(n_);
    std::memcpy(v.data(), all.data() + kGuardBytes, n_ * sizeof(T));
    return v;
  }

 private:
  size_t n_;
  cuda::DeviceBuffer buf_;
};

inline std::vector<float> bf16_vals(const std::vector<uint16_t>& b) {
  std::vector<float> f(b.size());
  for (size_t i = 0; i < b.size(); ++i) f[i] = bf16_to_f32(b[i]);
  return f;
}

// max|a − ref| / max|ref| over the elements where mask (if given) is set.
inline double max_rel(const std::vector<float>& a, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    num = std::max(num, std::fabs(double(a[i]) - ref[i]));
    den = std::max(den, std::fabs(double(ref[i])));
  }
  return den > 0 ? num / den : num;
}

// Prints one line of the error table (op, shape, metric, bound) and checks the bound.
inline void expect_err(const char* op, const std::string& shape, double err, double bound) {
  std::printf("[ error ] %-28s %-48s max|d|/max|ref| = %.3e (bound %.1e)\n", op, shape.c_str(), err, bound);
  EXPECT_LE(err, bound) << op << " " << shape;
}

// Uniform values in [-amp, amp) rounded to bf16: bits for the device, values for the CPU.
inline std::vector<uint16_t> rand_bf16(size_t n, Rng& r, float amp, std::vector<float>* vals = nullptr) {
  std::vector<uint16_t> b(n);
  if (vals) vals->resize(n);
  for (size_t i = 0; i < n; ++i) {
    b[i] = f32_to_bf16((2.f * r.uniform() - 1.f) * amp);
    if (vals) (*vals)[i] = bf16_to_f32(b[i]);
  }
  return b;
}

inline std::vector<float> rand_f32(size_t n, Rng& r, float amp, float offset = 0.f) {
  std::vector<float> v(n);
  for (auto& x : v) x = offset + (2.f * r.uniform() - 1.f) * amp;
  return v;
}

// V4's compressed-layer RoPE table (θ 160000, YaRN 16 over 65536) or the plain one (θ 10000).
inline RopeTable make_rope(int64_t rope_dim, bool yarn) {
  RopeConfig rc;
  rc.theta = yarn ? 160000.0 : 10000.0;
  rc.yarn = yarn;
  rc.factor = 16.0;
  rc.original_max_position = 65536.0;
  return RopeTable{rope_frequencies(rc, rope_dim), 1.0f, rope_dim};
}

}  // namespace cm::gputest
