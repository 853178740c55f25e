// Internal to the CPU op twins (*_cpu.cpp): a float exp that vectorises. glibc's expf is a
// call the compiler cannot vectorise (without -ffast-math, whose vector variants would also
// round differently in a loop's vector body than in its scalar remainder); the softmax of the
// cross-entropy and of attention, and GELU's tanh, spent most of their time in it. This one is
// inline, branch-free and made of IEEE operations with explicit fused multiply-adds, so a
// vectorised loop and its scalar remainder give the same bits, and the result depends on x
// alone (never on the thread count or the position in a loop).
//
//   exp(x) = 2^n · exp(r),  n = round(x / ln 2),  r = x − n · ln 2 in [−ln 2 / 2, ln 2 / 2]
// (Cody & Waite's reduction, ln 2 in two parts), exp(r) by its Taylor polynomial of degree 7
// (truncation error below 5e-9 relative, a twentieth of a float ulp), 2^n built in the
// exponent bits. Relative error within 2 ulp of the correctly rounded result where exp(x) is
// at least 2^-125 (x ≥ −86.6); below that (x < −86.99) it returns 0 rather than a value near
// float's smallest normal, and beyond ln(FLT_MAX) +infinity; NaN gives NaN.
// Tested against std::exp over a dense grid (tests/backend/ops/vector_math_test.cpp).
//
// lane_sum: a sum that vectorises yet has a fixed order: term i goes into partial sum
// i mod kSumLanes, the partial sums are added in lane order. The order depends on the count
// alone (not on the vector width or the thread count), and each partial sum is 16 times
// shorter than one running total, whose chain of dependent additions ran at a tenth of the
// adder's throughput.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

#include "backend/common/modular_arithmetic.hpp"

namespace backend::cpu::detail {

// COMMON_MODULAR_ARITHMETIC: the exponent is computed in unsigned arithmetic that wraps (below).
COMMON_MODULAR_ARITHMETIC inline float fast_exp(float x) {
  using std::fma;
  constexpr float kLog2e = 1.44269504088896341f;
  // 1.5 · 2^23: x · log2(e) + this is rounded to an integer, which then sits in the low
  // mantissa bits (for |n| < 2^22).
  constexpr float kRoundShift = 0x1.8p23f;
  // ln 2 = kLn2High + kLn2Low, kLn2High float(ln 2), kLn2Low the rest.
  constexpr float kLn2High = 0x1.62e430p-1f;
  constexpr float kLn2Low = -0x1.05c610p-29f;
  // std::max / std::min with x first keep a NaN (the comparison is false); the bounds keep n
  // in [−126, 128], where 2^(n − 1) below is a float or zero and 2 · 2^(n − 1) · exp(r) is
  // the result, overflowing to +infinity beyond ln(FLT_MAX).
  const float clamped = std::min(std::max(x, -87.5f), 89.0f);
  const float shifted = fma(clamped, kLog2e, kRoundShift);
  const float n = shifted - kRoundShift;
  float r = fma(-n, kLn2High, clamped);
  r = fma(-n, kLn2Low, r);
  // Taylor coefficients 1/k!, k = 7 … 0, by Horner's scheme.
  float p = 1.0f / 5040.0f;
  p = fma(p, r, 1.0f / 720.0f);
  p = fma(p, r, 1.0f / 120.0f);
  p = fma(p, r, 1.0f / 24.0f);
  p = fma(p, r, 1.0f / 6.0f);
  p = fma(p, r, 0.5f);
  p = fma(p, r, 1.0f);
  p = fma(p, r, 1.0f);
  // 2^(n − 1): biased exponent n − 1 + 127 in [0, 254]; 0 is the bit pattern of +0, so the
  // result flushes to zero at n = −126. Unsigned arithmetic: no overflow for a NaN's bits.
  const uint32_t n_bits = std::bit_cast<uint32_t>(shifted) - std::bit_cast<uint32_t>(kRoundShift);
  const float half_scale = std::bit_cast<float>((n_bits + 126u) << 23);
  return (p * 2.0f) * half_scale;
}

inline constexpr int64_t kSumLanes = 16;

// Σ_{i < count} term(i), term inlined into the vectorised loop (no array of the terms).
template <typename Scalar, typename Term>
Scalar lane_sum(int64_t count, Term term) {
  Scalar partial[kSumLanes] = {};
  const int64_t whole = count / kSumLanes * kSumLanes;
  for (int64_t i = 0; i < whole; i += kSumLanes) {
#pragma omp simd
    for (int64_t lane = 0; lane < kSumLanes; ++lane) partial[lane] += term(i + lane);
  }
  for (int64_t i = whole; i < count; ++i) partial[i - whole] += term(i);
  Scalar sum = 0;
  for (const Scalar lane_total : partial) sum += lane_total;
  return sum;
}

inline float lane_sum(const float* values, int64_t count) {
  return lane_sum<float>(count, [values](int64_t i) { return values[i]; });
}

}  // namespace backend::cpu::detail
