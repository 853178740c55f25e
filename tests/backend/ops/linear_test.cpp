// linear_forward / linear_backward: forward against a naive triple loop, backward against
// central finite differences in double, float against double.
#include "backend/ops/linear.hpp"

#include <doctest/doctest.h>

#include "tests/backend/ops/gradient_check.hpp"

namespace {

using namespace backend::testing;

constexpr int64_t kLinearRows = 7;
constexpr int64_t kIn = 5;
constexpr int64_t kOut = 6;

struct LinearCase {
  std::vector<double> input = random_values(kLinearRows * kIn, 11);
  std::vector<double> weight = random_values(kOut * kIn, 12);
  std::vector<double> bias = random_values(kOut, 13);
  std::vector<double> doutput = random_values(kLinearRows * kOut, 14);
  // Gradient buffers start non-zero to show that the parameter gradients accumulate.
  std::vector<double> dweight_start = random_values(kOut * kIn, 15);
  std::vector<double> dbias_start = random_values(kOut, 16);
};

struct LinearResult {
  std::vector<double> output, dinput, dweight, dbias;  // dweight/dbias: what backward added
};

template <typename Scalar>
LinearResult run_linear(const LinearCase& c) {
  const auto input = convert<Scalar>(c.input);
  const auto weight = convert<Scalar>(c.weight);
  const auto bias = convert<Scalar>(c.bias);
  const auto doutput = convert<Scalar>(c.doutput);
  std::vector<Scalar> output(kLinearRows * kOut);
  std::vector<Scalar> dinput(kLinearRows * kIn, Scalar{1000});  // must be overwritten
  auto dweight = convert<Scalar>(c.dweight_start);
  auto dbias = convert<Scalar>(c.dbias_start);
  backend::cpu::linear_forward(output.data(), input.data(), weight.data(), bias.data(), kLinearRows, kIn,
                               kOut);
  backend::cpu::linear_backward(dinput.data(), dweight.data(), dbias.data(), doutput.data(),
                                input.data(), weight.data(), kLinearRows, kIn, kOut);
  LinearResult result{convert<double>(output), convert<double>(dinput), {}, {}};
  for (size_t i = 0; i < dweight.size(); ++i) {
    result.dweight.push_back(static_cast<double>(dweight[i]) - c.dweight_start[i]);
  }
  for (size_t i = 0; i < dbias.size(); ++i) {
    result.dbias.push_back(static_cast<double>(dbias[i]) - c.dbias_start[i]);
  }
  return result;
}

}  // namespace

TEST_CASE("linear forward computes x · W^T + b") {
  LinearCase c;
  const LinearResult result = run_linear<double>(c);
  double worst = 0;
  for (int64_t r = 0; r < kLinearRows; ++r) {
    for (int64_t o = 0; o < kOut; ++o) {
      double expected = c.bias[o];
      for (int64_t i = 0; i < kIn; ++i) expected += c.input[r * kIn + i] * c.weight[o * kIn + i];
      worst = std::max(worst, std::abs(result.output[r * kOut + o] - expected));
    }
  }
  CHECK(worst < 1e-13);

  // Without a bias the product alone comes out.
  std::vector<double> output(kLinearRows * kOut);
  backend::cpu::linear_forward(output.data(), c.input.data(), c.weight.data(), nullptr, kLinearRows, kIn,
                               kOut);
  worst = 0;
  for (int64_t r = 0; r < kLinearRows; ++r) {
    for (int64_t o = 0; o < kOut; ++o) {
      worst =
          std::max(worst, std::abs(output[r * kOut + o] + c.bias[o] - result.output[r * kOut + o]));
    }
  }
  CHECK(worst < 1e-13);
}

TEST_CASE("linear backward matches central finite differences in double") {
  LinearCase c;
  const LinearResult result = run_linear<double>(c);
  std::vector<double> output(kLinearRows * kOut);
  // loss = Σ output · doutput, so d loss / d output = doutput.
  auto loss = [&] {
    backend::cpu::linear_forward(output.data(), c.input.data(), c.weight.data(), c.bias.data(),
                                 kLinearRows, kIn, kOut);
    return dot(output, c.doutput);
  };
  BACKEND_CHECK_GRADIENT(check_gradient(c.input, result.dinput, loss), 1e-6);
  BACKEND_CHECK_GRADIENT(check_gradient(c.weight, result.dweight, loss), 1e-6);
  BACKEND_CHECK_GRADIENT(check_gradient(c.bias, result.dbias, loss), 1e-6);
}

TEST_CASE("linear backward without dinput or bias leaves them alone and still accumulates dW") {
  LinearCase c;
  const LinearResult reference = run_linear<double>(c);
  auto dweight = c.dweight_start;
  backend::cpu::linear_backward(nullptr, dweight.data(), nullptr, c.doutput.data(), c.input.data(),
                                c.weight.data(), kLinearRows, kIn, kOut);
  CHECK(error_relative_to_max(difference(dweight, c.dweight_start), reference.dweight) < 1e-14);
}

TEST_CASE("linear in float matches double") {
  LinearCase c;
  const LinearResult single = run_linear<float>(c);
  const LinearResult reference = run_linear<double>(c);
  CHECK(error_relative_to_max(single.output, reference.output) < 1e-6);
  CHECK(error_relative_to_max(single.dinput, reference.dinput) < 1e-6);
  CHECK(error_relative_to_max(single.dweight, reference.dweight) < 1e-5);
  CHECK(error_relative_to_max(single.dbias, reference.dbias) < 1e-5);
}
