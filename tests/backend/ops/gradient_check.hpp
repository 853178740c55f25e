// Helpers shared by the op and model gradient tests: deterministic random tensors, central
// finite differences, and the error measures the checks compare against.
#pragma once

#include <omp.h>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <span>
#include <vector>

namespace backend::testing {

// Uniform in [-scale, scale), reproducible from the seed.
// The ops promise results that depend on the shapes alone, never on the thread count: runs
// `run` on one thread and on three (restoring the count) and returns both results.
template <typename Run>
auto on_one_and_three_threads(Run&& run) {
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  auto serial = run();
  omp_set_num_threads(3);
  auto parallel = run();
  omp_set_num_threads(threads);
  return std::pair{std::move(serial), std::move(parallel)};
}

inline std::vector<double> random_values(size_t count, uint64_t seed, double scale = 1.0) {
  std::mt19937_64 generator(seed);
  std::uniform_real_distribution<double> uniform(-scale, scale);
  std::vector<double> values(count);
  for (double& value : values) value = uniform(generator);
  return values;
}

// Uniform integers in [0, limit), reproducible from the seed.
inline std::vector<int32_t> random_ids(size_t count, int32_t limit, uint64_t seed) {
  std::mt19937_64 generator(seed);
  std::uniform_int_distribution<int32_t> uniform(0, limit - 1);
  std::vector<int32_t> ids(count);
  for (int32_t& id : ids) id = uniform(generator);
  return ids;
}

template <typename To, typename From>
std::vector<To> convert(std::span<const From> values) {
  return std::vector<To>(values.begin(), values.end());
}
template <typename To, typename From>
std::vector<To> convert(const std::vector<From>& values) {
  return std::vector<To>(values.begin(), values.end());
}

inline double dot(std::span<const double> a, std::span<const double> b) {
  double sum = 0;
  for (size_t i = 0; i < a.size(); ++i) sum += a[i] * b[i];
  return sum;
}

inline std::vector<double> difference(std::span<const double> a, std::span<const double> b) {
  std::vector<double> result(a.size());
  for (size_t i = 0; i < a.size(); ++i) result[i] = a[i] - b[i];
  return result;
}

inline double max_abs(std::span<const double> values) {
  double result = 0;
  for (double value : values) result = std::max(result, std::abs(value));
  return result;
}

// max_i |approximate_i − reference_i| / max_i |reference_i|: how far a lower-precision result
// is from the reference, in units of the reference's largest entry.
template <typename Scalar>
double error_relative_to_max(std::span<const Scalar> approximate,
                             std::span<const double> reference) {
  double worst = 0;
  for (size_t i = 0; i < reference.size(); ++i) {
    worst = std::max(worst, std::abs(static_cast<double>(approximate[i]) - reference[i]));
  }
  const double scale = max_abs(reference);
  return scale > 0 ? worst / scale : worst;
}
template <typename Scalar>
double error_relative_to_max(const std::vector<Scalar>& approximate,
                             const std::vector<double>& reference) {
  return error_relative_to_max(std::span<const Scalar>(approximate),
                               std::span<const double>(reference));
}

struct GradientReport {
  double max_relative_error = 0;  // |analytic − numeric| / max(|analytic|, |numeric|, floor)
  size_t worst_index = 0;
  double analytic_at_worst = 0;
  double numeric_at_worst = 0;
  size_t checked = 0;
};

struct GradientCheckOptions {
  // Step of the central difference. Its error is O(eps^order) from truncation plus
  // O(rounding(loss) / eps); 1e-5 balances the two for the second-order stencil on the O(1)
  // losses of the op tests.
  double eps = 1e-5;
  // 2: (f(x+h) − f(x−h)) / 2h.  4: (8(f(x+h) − f(x−h)) − (f(x+2h) − f(x−2h))) / 12h, whose
  // O(h⁴) truncation allows a step large enough that rounding in the loss stays small too.
  int order = 2;
  // Elements far smaller than the tensor's largest gradient are compared against this
  // fraction of it instead of their own size: there the difference quotient's rounding
  // error, not the gradient, sets the relative error.
  double floor_relative_to_max = 1e-3;
  std::span<const size_t> indices = {};  // elements to check; all when empty
};

// Compares analytic[i] with the central difference of loss() with respect to values[i].
// values[i] is restored after each probe.
inline GradientReport check_gradient(std::span<double> values, std::span<const double> analytic,
                                     const std::function<double()>& loss,
                                     const GradientCheckOptions& options = {}) {
  GradientReport report;
  const double eps = options.eps;
  double floor = 0;
  for (size_t i = 0; i < analytic.size(); ++i) {
    if (options.indices.empty() ||
        std::find(options.indices.begin(), options.indices.end(), i) != options.indices.end()) {
      floor = std::max(floor, std::abs(analytic[i]));
    }
  }
  floor = std::max(floor * options.floor_relative_to_max, 1e-300);
  auto probe = [&](size_t i) {
    const double saved = values[i];
    auto loss_at = [&](double step) {
      values[i] = saved + step;
      const double value = loss();
      values[i] = saved;
      return value;
    };
    const double near = loss_at(eps) - loss_at(-eps);
    const double numeric = options.order == 4
                               ? (8 * near - (loss_at(2 * eps) - loss_at(-2 * eps))) / (12 * eps)
                               : near / (2 * eps);
    const double error = std::abs(analytic[i] - numeric) /
                         std::max({std::abs(analytic[i]), std::abs(numeric), floor});
    if (error >= report.max_relative_error) {
      report.max_relative_error = error;
      report.worst_index = i;
      report.analytic_at_worst = analytic[i];
      report.numeric_at_worst = numeric;
    }
    ++report.checked;
  };
  if (options.indices.empty()) {
    for (size_t i = 0; i < values.size(); ++i) probe(i);
  } else {
    for (size_t i : options.indices) probe(i);
  }
  return report;
}

}  // namespace backend::testing

// CHECKs that a GradientReport is below `tolerance`, and that it checked something at all.
#define BACKEND_CHECK_GRADIENT(report_expression, tolerance)                                  \
  do {                                                                                        \
    const ::backend::testing::GradientReport gradient_report = (report_expression);           \
    INFO("worst element " << gradient_report.worst_index << " of " << gradient_report.checked \
                          << " checked: analytic " << gradient_report.analytic_at_worst       \
                          << ", numeric " << gradient_report.numeric_at_worst);               \
    CHECK(gradient_report.checked > 0);                                                       \
    CHECK(gradient_report.max_relative_error < (tolerance));                                  \
  } while (false)
