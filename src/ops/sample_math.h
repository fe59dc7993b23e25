// The arithmetic the CPU and GPU samplers share, written once so both give the same bits
// (ops/sample.h): a counter-based random number (Philox4x32-10), an exp whose every step is an
// explicitly rounded IEEE operation (no library exp, no contraction), the integer weight of a
// token, the scaled draw. Compiled by g++ for the CPU and by nvcc for the GPU (CM_SAMPLE_HD).
#pragma once
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define CM_SAMPLE_HD __host__ __device__ __forceinline__
#else
#define CM_SAMPLE_HD inline
#endif

namespace cm::sample_math {

// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11) keyed by the
// request's seed, counting by the token's index: the i-th draw of a request depends on (seed, i) only,
// never on the batch it ran in or on the draws before it.
CM_SAMPLE_HD uint64_t philox_u64(uint64_t seed, uint64_t counter) {
  uint32_t c0 = uint32_t(counter), c1 = uint32_t(counter >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = uint32_t(seed), k1 = uint32_t(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = uint64_t(0xD2511F53u) * c0, p1 = uint64_t(0xCD9E8D57u) * c2;
    const uint32_t n0 = uint32_t(p1 >> 32) ^ c1 ^ k0, n2 = uint32_t(p0 >> 32) ^ c3 ^ k1;
    c1 = uint32_t(p1);
    c3 = uint32_t(p0);
    c0 = n0;
    c2 = n2;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return (uint64_t(c1) << 32) | c0;
}

// floor(u * n / 2^64): a draw in [0, n) from 64 random bits, exact integer arithmetic.
CM_SAMPLE_HD uint64_t scale_draw(uint64_t u, uint64_t n) {
#if defined(__CUDA_ARCH__)
  return __umul64hi(u, n);
#else
  return uint64_t((unsigned __int128)u * n >> 64);
#endif
}

CM_SAMPLE_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  volatile float r = a * b;  // a lone rounded product: never fused into a following add
  return r;
#endif
}
CM_SAMPLE_HD float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  volatile float r = a + b;
  return r;
#endif
}
CM_SAMPLE_HD float sub_rn(float a, float b) { return add_rn(a, -b); }
CM_SAMPLE_HD float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  volatile float r = a / b;
  return r;
#endif
}
CM_SAMPLE_HD float fma_rn(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return __builtin_fmaf(a, b, c);  // correctly rounded in software where the CPU has no FMA
#endif
}
CM_SAMPLE_HD float round_to_int(float x) {  // round half to even, as rintf in the default mode
#if defined(__CUDA_ARCH__)
  return rintf(x);
#else
  return __builtin_rintf(x);
#endif
}
CM_SAMPLE_HD float from_bits(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

// exp(y) for y <= 0, relative error ~1e-7 (Cody-Waite reduction by ln 2, degree-6 polynomial of
// Cephes' expf), 0 below -80 (so every result is a normal float and the 2^k scale is exact).
CM_SAMPLE_HD float exp_nonpos(float y) {
  if (!(y >= -80.0f)) return 0.0f;
  const float k = round_to_int(mul_rn(y, 1.44269504088896341f));
  float r = fma_rn(k, -0.693359375f, y);
  r = fma_rn(k, 2.12194440e-4f, r);
  float p = 1.9875691500e-4f;
  p = fma_rn(p, r, 1.3981999507e-3f);
  p = fma_rn(p, r, 8.3334519073e-3f);
  p = fma_rn(p, r, 4.1665795894e-2f);
  p = fma_rn(p, r, 1.6666665459e-1f);
  p = fma_rn(p, r, 5.0000001201e-1f);
  p = fma_rn(p, mul_rn(r, r), r);
  p = add_rn(p, 1.0f);
  return mul_rn(p, from_bits(uint32_t(int32_t(k) + 127) << 23));
}

// A token's integer weight: round-down of exp((a - m) / T) * 2^31, where a is its adjusted logit and
// m the largest allowed one (weight 2^31). Every filter and the draw work on these integers, so their
// sums are exact and independent of the order of summation; tokens below 2^-31 of the most likely
// one weigh 0 and are never drawn.
CM_SAMPLE_HD uint32_t weight(float a, float m, float temperature) {
  const float y = div_rn(sub_rn(a, m), temperature);
  const float p = exp_nonpos(y);
  const float w = mul_rn(p, 2147483648.0f);
  return w >= 2147483648.0f ? 2147483648u : uint32_t(w);
}

}  // namespace cm::sample_math
