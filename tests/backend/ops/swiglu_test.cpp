// swiglu_forward / swiglu_backward: the [a | b] chunking and silu(a) · b against the formula
// in double, known values of silu, backward against central finite differences in double,
// float against double (random, and the float path over a dense grid in ulp), thread-count
// independence.
#include "backend/ops/swiglu.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <limits>

#include "tests/backend/ops/gradient_check.hpp"

namespace {

using namespace backend::testing;

constexpr int64_t kSwigluRows = 5;
constexpr int64_t kFeatures = 7;

struct SwigluResult {
  std::vector<double> output, dinput;
};

template <typename Scalar>
SwigluResult run_swiglu(const std::vector<double>& input_values,
                        const std::vector<double>& doutput_values, int64_t rows, int64_t features) {
  const auto input = convert<Scalar>(input_values);
  const auto doutput = convert<Scalar>(doutput_values);
  std::vector<Scalar> output(static_cast<size_t>(rows * features), Scalar{1000});
  std::vector<Scalar> dinput(input.size(), Scalar{1000});  // must be overwritten
  backend::cpu::swiglu_forward(output.data(), input.data(), rows, features);
  backend::cpu::swiglu_backward(dinput.data(), doutput.data(), input.data(), rows, features);
  return {convert<double>(output), convert<double>(dinput)};
}

}  // namespace

TEST_CASE("swiglu forward chunks each row into [a | b] and computes silu(a) · b") {
  const auto input = random_values(kSwigluRows * 2 * kFeatures, 61, 4.0);
  const SwigluResult result =
      run_swiglu<double>(input, std::vector<double>(kSwigluRows * kFeatures, 1.0), kSwigluRows, kFeatures);
  double worst = 0;
  for (int64_t r = 0; r < kSwigluRows; ++r) {
    for (int64_t f = 0; f < kFeatures; ++f) {
      const double a = input[r * 2 * kFeatures + f];
      const double b = input[r * 2 * kFeatures + kFeatures + f];
      const double expected = a / (1 + std::exp(-a)) * b;
      worst = std::max(worst, std::abs(result.output[r * kFeatures + f] - expected));
    }
  }
  CHECK(worst < 1e-14);
}

TEST_CASE("swiglu: known values of silu, and large gates saturate") {
  // One row, gates a then linear parts b = 1, so the output is silu(a).
  const std::vector<double> gates = {0.0, 1.0, -1.0, 40.0, -800.0};
  std::vector<double> input = gates;
  input.insert(input.end(), gates.size(), 1.0);
  const auto features = static_cast<int64_t>(gates.size());
  const SwigluResult result =
      run_swiglu<double>(input, std::vector<double>(gates.size(), 1.0), 1, features);
  CHECK(result.output[0] == 0.0);
  CHECK(result.output[1] == doctest::Approx(0.7310585786300049).epsilon(1e-14));  // 1 · σ(1)
  CHECK(result.output[2] == doctest::Approx(-0.2689414213699951).epsilon(1e-14));
  CHECK(result.output[3] == doctest::Approx(40.0).epsilon(1e-15));
  CHECK(result.output[4] == 0.0);  // e^800 overflows; the limit, not a NaN
  CHECK(std::isfinite(result.dinput[4]));
  // d silu / da at 0 is σ(0) = 1/2; d/db at b = 1 is silu(a).
  CHECK(result.dinput[0] == doctest::Approx(0.5).epsilon(1e-15));
  CHECK(result.dinput[features + 1] == doctest::Approx(0.7310585786300049).epsilon(1e-14));
}

TEST_CASE("swiglu backward matches central finite differences in double") {
  auto input = random_values(kSwigluRows * 2 * kFeatures, 62, 4.0);
  const auto doutput = random_values(kSwigluRows * kFeatures, 63);
  const SwigluResult result = run_swiglu<double>(input, doutput, kSwigluRows, kFeatures);
  std::vector<double> output(kSwigluRows * kFeatures);
  auto loss = [&] {
    backend::cpu::swiglu_forward(output.data(), input.data(), kSwigluRows, kFeatures);
    return dot(output, doutput);
  };
  BACKEND_CHECK_GRADIENT(check_gradient(input, result.dinput, loss), 1e-6);
}

TEST_CASE("swiglu in float matches double") {
  const auto input = random_values(kSwigluRows * 2 * kFeatures, 64, 4.0);
  const auto doutput = random_values(kSwigluRows * kFeatures, 65);
  const SwigluResult single = run_swiglu<float>(input, doutput, kSwigluRows, kFeatures);
  const SwigluResult reference = run_swiglu<double>(input, doutput, kSwigluRows, kFeatures);
  CHECK(error_relative_to_max(single.output, reference.output) < 1e-6);
  CHECK(error_relative_to_max(single.dinput, reference.dinput) < 1e-6);
}

TEST_CASE("swiglu gives the same bits on every thread count") {
  constexpr int64_t rows = 256;
  constexpr int64_t features = 256;
  const auto input = random_values(rows * 2 * features, 66, 4.0);
  const auto doutput = random_values(rows * features, 67);
  const auto [serial, parallel] = on_one_and_three_threads([&] {
    const SwigluResult result = run_swiglu<double>(input, doutput, rows, features);
    std::vector<double> all = result.output;
    all.insert(all.end(), result.dinput.begin(), result.dinput.end());
    return all;
  });
  CHECK(serial == parallel);
}

TEST_CASE("swiglu in float is within a few ulp of silu in double over a dense grid") {
  // The float path's exponential is fast_exp (vector_math_cpu.hpp); linear = 1, so the
  // output is silu(gate) and dgate its derivative.
  constexpr int64_t kGridFeatures = 4096;
  std::vector<float> input(2 * kGridFeatures, 1.0f);
  for (int64_t f = 0; f < kGridFeatures; ++f) input[f] = -20.0f + 40.0f * f / kGridFeatures;
  std::vector<float> output(kGridFeatures), dinput(2 * kGridFeatures);
  const std::vector<float> ones(kGridFeatures, 1.0f);
  backend::cpu::swiglu_forward(output.data(), input.data(), 1, kGridFeatures);
  backend::cpu::swiglu_backward(dinput.data(), ones.data(), input.data(), 1, kGridFeatures);
  constexpr double kEpsilon = std::numeric_limits<float>::epsilon();
  double worst_output = 0, worst_derivative = 0;
  for (int64_t f = 0; f < kGridFeatures; ++f) {
    const double a = input[f];
    const double s = 1 / (1 + std::exp(-a));
    if (a == 0) {
      CHECK(output[f] == 0.0f);
      continue;
    }
    // Relative, over the conditioning 1 + |a| of exp(−a) at a rounded float argument.
    worst_output = std::max(worst_output, std::abs(output[f] - a * s) / std::abs(a * s) /
                                              kEpsilon / (1 + std::abs(a)));
    worst_derivative =
        std::max(worst_derivative, std::abs(dinput[f] - s * (1 + a * (1 - s))) / (1 + std::abs(a)));
  }
  CHECK(worst_output <= 4.0);
  CHECK(worst_derivative <= 4 * kEpsilon);
}
