// Standard normal deviates by inversion: Φ⁻¹, the inverse of the standard normal CDF, by
// Wichura's algorithm AS 241 (PPND16; M. J. Wichura, "The percentage points of the normal
// distribution", Applied Statistics 37(3), 1988, 477–484), relative error about 1e-16:
//   q = p − 1/2;  |q| ≤ 0.425:  Φ⁻¹(p) = q · A(r) / B(r),  r = 0.180625 − q²
//   otherwise  r = sqrt(−ln min(p, 1 − p)),  Φ⁻¹(p) = ±C(r − 1.6) / D(r − 1.6)   (r ≤ 5)
//                                                   ±E(r − 5) / F(r − 5)       (r > 5)
// with A…F the paper's degree-7 polynomials. 85 % of deviates take the central branch, a
// rational function without logarithm or trigonometry: several times cheaper than the
// Box–Muller transform (a logarithm, a square root and a sine/cosine per pair), which made
// the initialisation of a 126M-parameter model take seconds.
//
// standard_normal_at(key, i) is deviate i of the stream keyed by `key`: Φ⁻¹ of the uniform
// (2k + 1) · 2^-53, k the top 52 bits of splitmix64 output i (splitmix64.hpp): the midpoints
// of 2^52 equal cells, exact in double (2k + 1 < 2^53), symmetric about 1/2 and never 0 or 1,
// so every deviate is finite (|x| < 8.3) and depends on (key, i) alone: any thread, in any
// order, computes the same value.
// Everything is double; callers that want float round the result once.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

#include "backend/common/splitmix64.hpp"

namespace common {

namespace detail {

// Horner's scheme for c[0] + c[1]·x + … + c[7]·x⁷. Explicit fused multiply-adds (and below),
// so that a vectorised loop and a scalar call round alike whatever the compiler contracts.
// Written out rather than a loop, which would keep the callers' loops from vectorising.
inline double polynomial7(const double (&c)[8], double x) {
  using std::fma;
  return fma(fma(fma(fma(fma(fma(fma(c[7], x, c[6]), x, c[5]), x, c[4]), x, c[3]), x, c[2]), x,
                 c[1]),
             x, c[0]);
}

// AS 241's coefficients (PPND16), lowest degree first.
inline constexpr double kCentralNumerator[8] = {
      3.3871328727963666080e0, 1.3314166789178437745e+2, 1.9715909503065514427e+3,
      1.3731693765509461125e+4, 4.5921953931549871457e+4, 6.7265770927008700853e+4,
      3.3430575583588128105e+4, 2.5090809287301226727e+3};
inline constexpr double kCentralDenominator[8] = {
      1.0, 4.2313330701600911252e+1, 6.8718700749205790830e+2, 5.3941960214247511077e+3,
      2.1213794301586595867e+4, 3.9307895800092710610e+4, 2.8729085735721942674e+4,
      5.2264952788528545610e+3};
inline constexpr double kTailNumerator[8] = {
      1.42343711074968357734e0, 4.63033784615654529590e0, 5.76949722146069140550e0,
      3.64784832476320460504e0, 1.27045825245236838258e0, 2.41780725177450611770e-1,
      2.27238449892691845833e-2, 7.74545014278341407640e-4};
inline constexpr double kTailDenominator[8] = {
      1.0, 2.05319162663775882187e0, 1.67638483018380384940e0, 6.89767334985100004550e-1,
      1.48103976427480074590e-1, 1.51986665636164571966e-2, 5.47593808499534494600e-4,
      1.05075007164441684324e-9};
inline constexpr double kFarTailNumerator[8] = {
      6.65790464350110377720e0, 5.46378491116411436990e0, 1.78482653991729133580e0,
      2.96560571828504891230e-1, 2.65321895265761230930e-2, 1.24266094738807843860e-3,
      2.71155556874348757815e-5, 2.01033439929228813265e-7};
inline constexpr double kFarTailDenominator[8] = {
      1.0, 5.99832206555887937690e-1, 1.36929880922735805310e-1, 1.48753612908506148525e-2,
      7.86869131145613259100e-4, 1.84631831751005468180e-5, 1.42151175831644588870e-7,
      2.04426310338993978564e-15};

}  // namespace detail

// |q| = |p − 1/2| up to which the central rational function applies.
inline constexpr double kCentralHalfWidth = 0.425;

// Φ⁻¹(1/2 + q) by the central rational function: exact to rounding for |q| ≤ 0.425, finite
// (and meaningless) up to |q| ≤ 1/2. Branch-free, so loops over it vectorise.
inline double central_inverse_normal_cdf(double q) {
  const double r = std::fma(-q, q, 0.180625);
  return q * detail::polynomial7(detail::kCentralNumerator, r) /
         detail::polynomial7(detail::kCentralDenominator, r);
}

// Φ⁻¹(p) for p in (0, 1); p = 0 or 1 give ∓infinity, anything else outside is NaN.
inline double inverse_normal_cdf(double p) {
  const double q = p - 0.5;
  if (std::abs(q) <= kCentralHalfWidth) return central_inverse_normal_cdf(q);
  if (!(p > 0.0 && p < 1.0)) {
    if (p == 0.0) return -std::numeric_limits<double>::infinity();
    if (p == 1.0) return std::numeric_limits<double>::infinity();
    return std::numeric_limits<double>::quiet_NaN();
  }
  // 1 − p is exact for p ≥ 1/2 (Sterbenz), so the upper tail is as accurate as the lower.
  double r = std::sqrt(-std::log(q < 0 ? p : 1.0 - p));
  double x;
  if (r <= 5.0) {
    r -= 1.6;
    x = detail::polynomial7(detail::kTailNumerator, r) /
        detail::polynomial7(detail::kTailDenominator, r);
  } else {
    r -= 5.0;
    x = detail::polynomial7(detail::kFarTailNumerator, r) /
        detail::polynomial7(detail::kFarTailDenominator, r);
  }
  return q < 0 ? -x : x;
}

// The uniform in (0, 1) that deviate `index` of the stream keyed by `key` is Φ⁻¹ of.
inline double normal_uniform_at(uint64_t key, uint64_t index) {
  const uint64_t top52 = splitmix64_at(key, index) >> 12;
  // (2k + 1) · 2^-53 = (1 + k · 2^-52) − 1 + 2^-53, every step exact: the bit pattern of
  // 1 + k · 2^-52 is k under the exponent of 1, and AVX2 has no 64-bit integer conversion.
  return (std::bit_cast<double>(0x3FF0000000000000ull | top52) - 1.0) + 0x1.0p-53;
}

// Deviate `index` of the N(0, 1) stream keyed by `key`.
inline double standard_normal_at(uint64_t key, uint64_t index) {
  return inverse_normal_cdf(normal_uniform_at(key, index));
}

}  // namespace common
