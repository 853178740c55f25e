// inverse_normal_cdf (AS 241) against the normal CDF computed independently from std::erfc,
// over a dense grid of p and deep into both tails; standard_normal_at's deviates: a function of
// (key, index), finite, and N(0, 1) by their moments and empirical CDF.
#include "backend/common/inverse_normal_cdf.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <numbers>
#include <vector>

namespace {

// The lower-tail probability Φ(x) for x ≤ 0, from erfc (accurate to a few ulp, no cancellation
// on that side), and the density φ(x).
double lower_tail(double x) { return 0.5 * std::erfc(-x / std::numbers::sqrt2); }
double density(double x) { return std::exp(-0.5 * x * x) * std::numbers::inv_sqrtpi / std::numbers::sqrt2; }

// |x − Φ⁻¹(p)| estimated by one Newton step from x on the side where Φ is accurate: the distance
// to the exact quantile, up to erfc's rounding (relative 1e-16 of Φ, i.e. 1e-16 / |x| in x in
// the tails).
double quantile_error(double p, double x) {
  if (x <= 0) return std::abs(lower_tail(x) - p) / density(x);
  return std::abs(lower_tail(-x) - (1.0 - p)) / density(x);
}

}  // namespace

TEST_CASE("inverse normal CDF is Φ⁻¹ to about double rounding, centre and tails") {
  double worst = 0;
  // Dense in the centre and the switch points 0.075 and 0.925 (|q| = 0.425).
  for (int i = 1; i < 200000; ++i) {
    const double p = i / 200000.0;
    const double x = common::inverse_normal_cdf(p);
    worst = std::max(worst, quantile_error(p, x) / std::max(1.0, std::abs(x)));
  }
  // Log-spaced down to 1e-300 in the lower tail (r = sqrt(−ln p) crosses 5 at p ≈ 1.4e-11).
  for (double p = 0.07; p > 1e-300; p *= 0.93) {
    const double x = common::inverse_normal_cdf(p);
    REQUIRE(x < 0);
    worst = std::max(worst, quantile_error(p, x) / std::abs(x));
  }
  CHECK(worst < 1e-14);
  // Known quantiles.
  CHECK(common::inverse_normal_cdf(0.5) == 0.0);
  CHECK(common::inverse_normal_cdf(0.975) == doctest::Approx(1.959963984540054).epsilon(1e-15));
  CHECK(common::inverse_normal_cdf(0.8413447460685429) ==
        doctest::Approx(1.0).epsilon(1e-14));  // Φ(1)
}

TEST_CASE("inverse normal CDF is odd about 1/2 and handles the ends") {
  for (int i = 1; i < 1000; ++i) {
    const double p = i / 2048.0;  // exact, and so is 1 − p
    CHECK(common::inverse_normal_cdf(1.0 - p) == -common::inverse_normal_cdf(p));
  }
  CHECK(common::inverse_normal_cdf(0.0) == -std::numeric_limits<double>::infinity());
  CHECK(common::inverse_normal_cdf(1.0) == std::numeric_limits<double>::infinity());
  CHECK(std::isnan(common::inverse_normal_cdf(-0.1)));
  CHECK(std::isnan(common::inverse_normal_cdf(1.5)));
  CHECK(std::isnan(common::inverse_normal_cdf(std::numeric_limits<double>::quiet_NaN())));
}

TEST_CASE("standard_normal_at gives N(0, 1) deviates that depend on (key, index) alone") {
  constexpr int kCount = 1 << 20;
  const uint64_t key = common::splitmix64_mix(42);
  std::vector<double> values(kCount);
  for (int i = 0; i < kCount; ++i) values[i] = common::standard_normal_at(key, i);
  // Backwards, one by one: the same numbers (no hidden state).
  for (int i = kCount - 1; i >= 0; i -= 9973) {
    REQUIRE(common::standard_normal_at(key, i) == values[i]);
  }
  double sum = 0, squares = 0, cubes = 0, fourth = 0;
  for (double x : values) {
    REQUIRE(std::isfinite(x));
    REQUIRE(std::abs(x) < 8.3);
    sum += x;
    squares += x * x;
    cubes += x * x * x;
    fourth += x * x * x * x;
  }
  const double n = kCount;
  // Five standard errors of each sample moment (variances 1, 2, 15 and 96 for N(0, 1)).
  CHECK(std::abs(sum / n) < 5 / std::sqrt(n));
  CHECK(std::abs(squares / n - 1) < 5 * std::sqrt(2 / n));
  CHECK(std::abs(cubes / n) < 5 * std::sqrt(15 / n));
  CHECK(std::abs(fourth / n - 3) < 5 * std::sqrt(96 / n));
  // The empirical CDF at a few points against Φ, within five binomial standard errors.
  for (double at : {-3.0, -2.0, -1.0, -0.25, 0.0, 0.5, 1.5, 2.5}) {
    double below = 0;
    for (double x : values) below += x <= at ? 1 : 0;
    const double probability = at <= 0 ? lower_tail(at) : 1 - lower_tail(-at);
    INFO("at " << at);
    CHECK(std::abs(below / n - probability) < 5 * std::sqrt(probability * (1 - probability) / n));
  }
  // Another key: other deviates.
  const uint64_t other = common::splitmix64_mix(43);
  int equal = 0;
  for (int i = 0; i < 1000; ++i) equal += common::standard_normal_at(other, i) == values[i];
  CHECK(equal == 0);
}
