// Helpers of the op table's cases: the random generator and random inputs
// (NVFP4 weights with zero, subnormal and negative block scales; bf16 values
// with their floats for the CPU), device uploads, guarded device outputs
// (canary zones around every output, the output itself NaN bytes before the
// run) and the error metrics.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "backend/cuda/core/cuda_util.h"
#include "bench/optable/op_case.h"
#include "common/error.h"
#include "common/numeric.h"
#include "ops/linear.h"
#include "ops/rope.h"

namespace cm::optable {

// xorshift64*: fast enough to fill hundreds of MB per case.
struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ULL + 1) {}
  uint64_t next() {
    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    return s * 0x2545F4914F6CDD1DULL;
  }
  float uniform() { return float(next() >> 40) / float(1 << 24); }  // [0, 1)
};

// A random valid E4M3 block scale: 1/64 zero, 7/64 subnormal, 1/64 negative, else about 2^-2 .. 2^3.
uint8_t random_scale(Rng& r);
LinearWeight random_nvfp4(int64_t N, int64_t K, uint64_t seed, float scale_2 = 0.03125f);

// Uniform values in [-amp, amp) rounded to bf16: bits for the device, floats for the reference.
void random_bf16(size_t n, uint64_t seed, float amp, std::vector<uint16_t>& bits, std::vector<float>& vals);
std::vector<uint16_t> rand_bf16(size_t n, Rng& r, float amp, std::vector<float>* vals = nullptr);
std::vector<float> rand_f32(size_t n, Rng& r, float amp, float offset = 0.f);
std::vector<float> bf16_vals(const std::vector<uint16_t>& b);

// ||a - b|| / ||b||, with a count of non-finite entries of a.
double rel_error(const std::vector<float>& a, const std::vector<float>& b, int64_t* nonfinite = nullptr);
// max|a - ref| / max|ref| (non-finite entries of a count as an infinite error).
double max_rel(const std::vector<float>& a, const std::vector<float>& ref);

// V4's compressed-layer RoPE table (theta 160000, YaRN 16 over 65536) or the plain one (theta 10000).
RopeTable make_rope(int64_t rope_dim, bool yarn);

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

// Canary bytes around a device output.
inline constexpr size_t kGuardBytes = 4096;
inline constexpr uint8_t kCanary = 0xA5;

// Counts canary bytes of raw (pad + body + pad) that changed, outside [pad, pad + body).
size_t broken_canaries(const std::vector<uint8_t>& raw, size_t body);

// A device output of n elements T with canary zones before and after; the
// output starts as 0xFF bytes (NaN for f32 and bf16, -1 for int32), so an
// element the kernel forgot fails the comparison.
template <typename T>
class Guarded {
 public:
  explicit Guarded(size_t n) : n_(n), buf_(n * sizeof(T) + 2 * kGuardBytes) {
    CM_CUDA(cudaMemset(buf_.get(), kCanary, buf_.size()));
    CM_CUDA(cudaMemset(ptr(), 0xFF, n * sizeof(T)));
  }
  T* ptr() const { return reinterpret_cast<T*>(static_cast<char*>(buf_.get()) + kGuardBytes); }
  // The output; a changed canary byte fails c with `what`.
  std::vector<T> get(Checker& c, const std::string& what = "output") const {
    std::vector<uint8_t> all(buf_.size());
    buf_.download(all.data(), all.size());
    const size_t bad = broken_canaries(all, n_ * sizeof(T));
    c.expect(bad == 0, what + ": kernel wrote outside its output (" + std::to_string(bad) + " canary bytes changed)");
    std::vector<T> v(n_);
    if (n_) std::memcpy(v.data(), all.data() + kGuardBytes, n_ * sizeof(T));
    return v;
  }

 private:
  size_t n_;
  cuda::DeviceBuffer buf_;
};

// A [M, N] output of 4-byte (f32) or 2-byte (bf16) elements with row stride
// N + 8: canary zones before and after and 8 canary columns after each row.
class GuardedRows {
 public:
  static constexpr int64_t kCanaryCols = 8;
  GuardedRows(int64_t M, int64_t N, size_t elem_bytes);
  void* ptr() const { return buf_.as<char>() + kGuardBytes; }
  int64_t ld() const { return N_ + kCanaryCols; }
  // The raw rows [M, N] (elem_bytes each); changed canaries fail c.
  std::vector<uint8_t> raw(Checker& c, const std::string& what = "output") const;
  // The rows as floats (bf16 widened).
  std::vector<float> values(Checker& c, const std::string& what = "output") const;
  // raw()'s bytes as floats.
  std::vector<float> widen(const std::vector<uint8_t>& raw) const;

 private:
  int64_t M_, N_;
  size_t es_;
  cuda::DeviceBuffer buf_;
};

// Helpers of the checks ported from hand-written tests: bit equality of two vectors, an error line, a
// refusal (cm::Error expected), and Msg, a streamed message (Msg() << "row " << m) for Checker::expect.
template <typename T>
void same(Checker& c, const std::vector<T>& a, const std::vector<T>& b, const std::string& what) {
  if (a.size() != b.size()) {
    c.expect(false, what + ": sizes differ");
    return;
  }
  c.same_bits(a.data(), b.data(), a.size() * sizeof(T), what);
}

inline void err(Checker& c, const std::string& op, const std::string& shape, double e, double bound) {
  c.err(op + " " + shape + " max|d|/max|ref|", e, bound);
}

template <typename F>
void throws(Checker& c, F&& f, const std::string& what) {
  bool threw = false;
  try {
    f();
  } catch (const Error&) {
    threw = true;
  }
  c.expect(threw, what + ": expected cm::Error");
}

struct Msg {
  std::ostringstream s;
  template <typename T>
  Msg& operator<<(const T& v) {
    s << v;
    return *this;
  }
  operator std::string() const { return s.str(); }
};

// A device copy of buffer b (same bytes at another address; the bench's L2 rotation).
cuda::DeviceBuffer clone(const cuda::DeviceBuffer& b);

// Operand sets for the bench: enough copies of `bytes` that they pass 256 MB (L2 holds 60 MB), at most 128.
int rotation_copies(double bytes);

}  // namespace cm::optable
