// gelu_forward / gelu_backward: known values of the tanh approximation, backward against
// central finite differences in double, float against double: on random inputs, and the float
// path's exp-based form (gelu_cpu.cpp) against the tanh formula in double over a dense grid,
// bounded in float ulp; the same bits on one thread and on three.
#include "backend/ops/gelu.hpp"

#include <doctest/doctest.h>

#include <limits>

#include "tests/backend/ops/gradient_check.hpp"

namespace {

using namespace backend::testing;

constexpr int64_t kCount = 40;

struct GeluResult {
  std::vector<double> output, dinput;
};

template <typename Scalar>
GeluResult run_gelu(const std::vector<double>& input_values,
                    const std::vector<double>& doutput_values) {
  const auto input = convert<Scalar>(input_values);
  const auto doutput = convert<Scalar>(doutput_values);
  std::vector<Scalar> output(input.size());
  std::vector<Scalar> dinput(input.size(), Scalar{1000});  // must be overwritten
  backend::cpu::gelu_forward(output.data(), input.data(), static_cast<int64_t>(input.size()));
  backend::cpu::gelu_backward(dinput.data(), doutput.data(), input.data(),
                              static_cast<int64_t>(input.size()));
  return {convert<double>(output), convert<double>(dinput)};
}

}  // namespace

TEST_CASE("gelu forward is the tanh approximation") {
  const std::vector<double> input = {-3.0, -1.0, -0.5, 0.0, 0.5, 1.0, 3.0};
  const GeluResult result = run_gelu<double>(input, std::vector<double>(input.size(), 1.0));
  for (size_t i = 0; i < input.size(); ++i) {
    const double x = input[i];
    const double expected =
        0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
    CHECK(result.output[i] == doctest::Approx(expected).epsilon(1e-14));
  }
  // Reference values of the tanh form (differ from the erf GELU in the 4th digit).
  CHECK(result.output[5] == doctest::Approx(0.8411919906).epsilon(1e-9));
  CHECK(result.output[1] == doctest::Approx(-0.1588080094).epsilon(1e-9));
  CHECK(result.output[3] == 0.0);
}

TEST_CASE("gelu backward matches central finite differences in double") {
  auto input = random_values(kCount, 31, 4.0);
  const auto doutput = random_values(kCount, 32);
  const GeluResult result = run_gelu<double>(input, doutput);
  std::vector<double> output(kCount);
  auto loss = [&] {
    backend::cpu::gelu_forward(output.data(), input.data(), kCount);
    return dot(output, doutput);
  };
  BACKEND_CHECK_GRADIENT(check_gradient(input, result.dinput, loss), 1e-6);
}

TEST_CASE("gelu backward works in place (dinput aliasing doutput)") {
  const auto input = random_values(kCount, 33, 4.0);
  const auto doutput = random_values(kCount, 34);
  const GeluResult reference = run_gelu<double>(input, doutput);
  auto gradient = doutput;
  backend::cpu::gelu_backward(gradient.data(), gradient.data(), input.data(), kCount);
  CHECK(gradient == reference.dinput);
}

TEST_CASE("gelu in float matches double") {
  const auto input = random_values(kCount, 35, 4.0);
  const auto doutput = random_values(kCount, 36);
  const GeluResult single = run_gelu<float>(input, doutput);
  const GeluResult reference = run_gelu<double>(input, doutput);
  CHECK(error_relative_to_max(single.output, reference.output) < 1e-6);
  CHECK(error_relative_to_max(single.dinput, reference.dinput) < 1e-6);
}

namespace {

// GELU in double at a float input: the tanh formula of gelu.hpp where 1 + tanh(u) ≥ 0.005
// (then it loses at most 8 bits of double's 53 to the cancellation), else the same quantity
// as x · exp(2u) / (1 + exp(2u)), which does not cancel. (The tanh formula in float, the
// float path before gelu_cpu.cpp's exp form, is off by up to 100 % below x = −5.)
double reference_gelu(double x) {
  const double u = std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x);
  if (u > -3) return 0.5 * x * (1 + std::tanh(u));
  return x * std::exp(2 * u) / (1 + std::exp(2 * u));
}
double reference_gelu_derivative(double x) {
  const double s = std::sqrt(2 / M_PI);
  const double tanh_u = std::tanh(s * (x + 0.044715 * x * x * x));
  return 0.5 * (1 + tanh_u) + 0.5 * x * (1 - tanh_u * tanh_u) * s * (1 + 3 * 0.044715 * x * x);
}

}  // namespace

TEST_CASE("gelu in float is within a few ulp of the tanh formula, tails included") {
  // Every 2^-12 over [−12, 12]: below −9.5 the output is under 1e-30, at −12 it underflows.
  std::vector<float> input;
  for (double x = -12.0; x <= 12.0; x += 0x1.0p-12) input.push_back(static_cast<float>(x));
  const auto count = static_cast<int64_t>(input.size());
  std::vector<float> output(input.size()), dinput(input.size());
  const std::vector<float> ones(input.size(), 1.0f);
  backend::cpu::gelu_forward(output.data(), input.data(), count);
  backend::cpu::gelu_backward(dinput.data(), ones.data(), input.data(), count);
  constexpr double kEpsilon = std::numeric_limits<float>::epsilon();
  double worst_output = 0, worst_tiny = 0, worst_derivative = 0;
  for (size_t i = 0; i < input.size(); ++i) {
    const double x = input[i];
    const double expected = reference_gelu(x);
    const double error = std::abs(output[i] - expected);
    if (std::abs(expected) < 1e-30) {
      worst_tiny = std::max(worst_tiny, error);
    } else {
      // Relative, in float epsilons, over the conditioning 1 + |u|: exp(−2u) magnifies the
      // rounding of its float argument u by |2u|, as it would for any float evaluation.
      const double u = std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x);
      worst_output = std::max(worst_output, error / std::abs(expected) / kEpsilon / (1 + std::abs(u)));
    }
    // The derivative crosses zero (near x = −0.75): its error is absolute, against its scale
    // of 1.
    worst_derivative =
        std::max(worst_derivative, std::abs(dinput[i] - reference_gelu_derivative(x)));
  }
  CHECK(worst_output <= 4.0);
  CHECK(worst_tiny <= 1e-30);
  CHECK(worst_derivative <= 4 * kEpsilon);
  CHECK(std::abs(dinput.front()) < 1e-30);
}

TEST_CASE("gelu gives the same bits on one thread and on three") {
  // Larger than the size from which the ops go parallel, and not a multiple of a vector.
  const auto values = random_values(100003, 37, 6.0);
  const auto input = convert<float>(values);
  const auto doutput = convert<float>(random_values(values.size(), 38));
  const auto count = static_cast<int64_t>(input.size());
  const auto [serial, parallel] = on_one_and_three_threads([&] {
    std::vector<float> output(input.size()), dinput(input.size());
    backend::cpu::gelu_forward(output.data(), input.data(), count);
    backend::cpu::gelu_backward(dinput.data(), doutput.data(), input.data(), count);
    return std::pair{output, dinput};
  });
  CHECK(serial.first == parallel.first);
  CHECK(serial.second == parallel.second);
}
