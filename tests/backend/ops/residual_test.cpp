// residual_forward: the sum, in place included, float and double.
#include "backend/ops/residual.hpp"

#include <doctest/doctest.h>

#include "tests/backend/ops/gradient_check.hpp"

using namespace backend::testing;

TEST_CASE("residual adds the branch onto the stream, also in place") {
  constexpr int64_t count = 50;
  const auto input = random_values(count, 41);
  const auto branch = random_values(count, 42);
  std::vector<double> output(count);
  backend::cpu::residual_forward(output.data(), input.data(), branch.data(), count);
  for (int64_t i = 0; i < count; ++i) CHECK(output[i] == input[i] + branch[i]);

  auto stream = input;  // output aliasing input, as the model's backward uses it
  backend::cpu::residual_forward(stream.data(), stream.data(), branch.data(), count);
  CHECK(stream == output);

  const auto input_single = convert<float>(input);
  const auto branch_single = convert<float>(branch);
  std::vector<float> output_single(count);
  backend::cpu::residual_forward(output_single.data(), input_single.data(), branch_single.data(),
                                 count);
  CHECK(error_relative_to_max(output_single, output) < 1e-6);
}
