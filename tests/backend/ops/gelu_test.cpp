// gelu_forward / gelu_backward: known values of the tanh approximation, backward against
// central finite differences in double, float against double.
#include "backend/ops/gelu.hpp"

#include <doctest/doctest.h>

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
