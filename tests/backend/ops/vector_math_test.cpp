// detail::fast_exp against std::exp in double (the exact value to far below a float ulp) over
// a dense grid of the whole float range, in ulp of the result; its documented edges (flush
// to zero, overflow, NaN); and that a vectorised loop over it gives each element's value.
#include "backend/ops/vector_math_cpu.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <numbers>
#include <vector>

namespace {

using backend::cpu::detail::fast_exp;

// |approximate − exact| in units of the last place of the float nearest `exact` (a normal).
double ulp_error(float approximate, double exact) {
  int exponent = 0;
  std::frexp(exact, &exponent);  // exact = m · 2^exponent, m in [0.5, 1)
  const double ulp = std::ldexp(1.0, exponent - 24);
  return std::abs(static_cast<double>(approximate) - exact) / ulp;
}

}  // namespace

TEST_CASE("fast_exp is within 2 ulp of exp over the normal float range") {
  double worst = 0;
  float worst_at = 0;
  auto check = [&](float x) {
    const double error = ulp_error(fast_exp(x), std::exp(static_cast<double>(x)));
    if (error > worst) {
      worst = error;
      worst_at = x;
    }
  };
  // Every 2^-13 from −86.6 (exp ≈ 2^-125) to ln(FLT_MAX): 1.4 million points, each reduction
  // interval [(n − 1/2) ln 2, (n + 1/2) ln 2] crossed at about 5700 of them.
  for (double x = -86.6; x < 88.72; x += 0x1.0p-13) check(static_cast<float>(x));
  // Every float in [−1, 1] with an exponent ≥ −20 in steps of 64 ulp, and the float neighbours
  // of the reduction boundaries, where r is at its largest.
  for (float x = 0x1.0p-20f; x < 1.0f; x = std::nextafter(x, 2.0f) + x * 0x1.0p-18f) {
    check(x);
    check(-x);
  }
  for (int n = -124; n <= 127; ++n) {
    const auto boundary = static_cast<float>((n + 0.5) * std::numbers::ln2);
    float below = boundary, above = boundary;
    for (int k = 0; k < 8; ++k) {
      check(below);
      check(above);
      below = std::nextafter(below, -100.0f);
      above = std::nextafter(above, 100.0f);
    }
  }
  INFO("worst at x = " << worst_at);
  CHECK(worst <= 2.0);
  CHECK(fast_exp(0.0f) == 1.0f);
  CHECK(fast_exp(1.0f) == doctest::Approx(std::numbers::e).epsilon(2e-7));
}

TEST_CASE("fast_exp: zero below the normal range, infinity above, NaN stays NaN") {
  constexpr float kInfinity = std::numeric_limits<float>::infinity();
  CHECK(fast_exp(-87.0f) == 0.0f);
  CHECK(fast_exp(-1000.0f) == 0.0f);
  CHECK(fast_exp(-kInfinity) == 0.0f);
  CHECK(fast_exp(88.72f) < kInfinity);
  CHECK(fast_exp(88.72f) > 3.3e38f);
  CHECK(fast_exp(88.73f) == kInfinity);
  CHECK(fast_exp(1000.0f) == kInfinity);
  CHECK(fast_exp(kInfinity) == kInfinity);
  CHECK(std::isnan(fast_exp(std::numeric_limits<float>::quiet_NaN())));
  // Between the flush and the normal range: 0 or within 2 ulp, never anything else.
  for (float x = -86.99f; x < -86.6f; x += 0.001f) {
    const float value = fast_exp(x);
    CHECK((value == 0.0f || ulp_error(value, std::exp(static_cast<double>(x))) <= 2.0));
  }
}

TEST_CASE("fast_exp in a vectorised loop gives every element its own value") {
  // 1001 elements: vector body and scalar remainder both run.
  std::vector<float> input(1001), output(1001);
  for (size_t i = 0; i < input.size(); ++i) input[i] = -80.0f + 0.16f * static_cast<float>(i);
  // A signed index: clang's OpenMP lowering of an unsigned one computes 0 − 1 in its trip
  // count, which the asan preset's integer checks report.
  const auto count = static_cast<int64_t>(input.size());
  const float* in = input.data();
  float* out = output.data();
#pragma omp simd
  for (int64_t i = 0; i < count; ++i) out[i] = fast_exp(in[i]);
  for (size_t i = 0; i < input.size(); ++i) {
    volatile float x = input[i];  // a scalar evaluation, not part of the loop above
    REQUIRE(output[i] == fast_exp(x));
  }
}
