// rmsnorm_forward / rmsnorm_backward: forward against the formula in double (and its defining
// property: unit root mean square before the weight), backward against central finite
// differences in double, float against double, thread-count independence.
#include "backend/ops/rmsnorm.hpp"

#include <doctest/doctest.h>

#include <cmath>

#include "tests/backend/ops/gradient_check.hpp"

namespace {

using namespace backend::testing;

constexpr int64_t kRmsNormRows = 6;
constexpr int64_t kRmsNormChannels = 10;
constexpr double kRmsNormEpsilon = 1e-5;

struct RmsnormCase {
  RmsnormCase() {
    // An offset per row: RMSNorm must not centre, so a shifted row normalises differently.
    for (int64_t r = 0; r < kRmsNormRows; ++r) {
      for (int64_t c = 0; c < kRmsNormChannels; ++c)
        input[r * kRmsNormChannels + c] += 0.5 * static_cast<double>(r);
    }
  }
  std::vector<double> input = random_values(kRmsNormRows * kRmsNormChannels, 51, 2.0);
  std::vector<double> weight = random_values(kRmsNormChannels, 52);
  std::vector<double> doutput = random_values(kRmsNormRows * kRmsNormChannels, 53);
  std::vector<double> dweight_start = random_values(kRmsNormChannels, 54);
};

struct RmsnormResult {
  std::vector<double> output, rstd, dinput, dweight;
};

template <typename Scalar>
RmsnormResult run_rmsnorm(const RmsnormCase& c) {
  const auto input = convert<Scalar>(c.input);
  const auto weight = convert<Scalar>(c.weight);
  const auto doutput = convert<Scalar>(c.doutput);
  std::vector<Scalar> output(kRmsNormRows * kRmsNormChannels), rstd(kRmsNormRows);
  std::vector<Scalar> dinput(kRmsNormRows * kRmsNormChannels, Scalar{1000});  // must be overwritten
  auto dweight = convert<Scalar>(c.dweight_start);
  backend::cpu::rmsnorm_forward(output.data(), rstd.data(), input.data(), weight.data(),
                                static_cast<Scalar>(kRmsNormEpsilon), kRmsNormRows, kRmsNormChannels);
  backend::cpu::rmsnorm_backward(dinput.data(), dweight.data(), doutput.data(), input.data(),
                                 weight.data(), rstd.data(), kRmsNormRows, kRmsNormChannels);
  return {convert<double>(output), convert<double>(rstd), convert<double>(dinput),
          difference(convert<double>(dweight), c.dweight_start)};
}

}  // namespace

TEST_CASE("rmsnorm forward is x / sqrt(mean(x²) + eps) · weight, without centring") {
  RmsnormCase c;
  const RmsnormResult result = run_rmsnorm<double>(c);
  double worst = 0;
  for (int64_t r = 0; r < kRmsNormRows; ++r) {
    const double* x = c.input.data() + r * kRmsNormChannels;
    double mean_square = 0;
    for (int64_t i = 0; i < kRmsNormChannels; ++i) mean_square += x[i] * x[i] / kRmsNormChannels;
    const double rstd = 1 / std::sqrt(mean_square + kRmsNormEpsilon);
    CHECK(result.rstd[r] == doctest::Approx(rstd).epsilon(1e-12));
    double normalised_square = 0;
    for (int64_t i = 0; i < kRmsNormChannels; ++i) {
      worst =
          std::max(worst, std::abs(result.output[r * kRmsNormChannels + i] - x[i] * rstd * c.weight[i]));
      const double normalised = result.output[r * kRmsNormChannels + i] / c.weight[i];
      normalised_square += normalised * normalised / kRmsNormChannels;
    }
    // Before the weight every row has root mean square 1 (up to epsilon's share).
    CHECK(normalised_square ==
          doctest::Approx(mean_square / (mean_square + kRmsNormEpsilon)).epsilon(1e-10));
  }
  CHECK(worst < 1e-12);
}

TEST_CASE("rmsnorm backward matches central finite differences in double") {
  RmsnormCase c;
  const RmsnormResult result = run_rmsnorm<double>(c);
  std::vector<double> output(kRmsNormRows * kRmsNormChannels), rstd(kRmsNormRows);
  auto loss = [&] {
    backend::cpu::rmsnorm_forward(output.data(), rstd.data(), c.input.data(), c.weight.data(),
                                  kRmsNormEpsilon, kRmsNormRows, kRmsNormChannels);
    return dot(output, c.doutput);
  };
  BACKEND_CHECK_GRADIENT(check_gradient(c.input, result.dinput, loss), 1e-6);
  BACKEND_CHECK_GRADIENT(check_gradient(c.weight, result.dweight, loss), 1e-6);
}

TEST_CASE("rmsnorm in float matches double") {
  RmsnormCase c;
  const RmsnormResult single = run_rmsnorm<float>(c);
  const RmsnormResult reference = run_rmsnorm<double>(c);
  CHECK(error_relative_to_max(single.output, reference.output) < 1e-5);
  CHECK(error_relative_to_max(single.dinput, reference.dinput) < 1e-5);
  CHECK(error_relative_to_max(single.dweight, reference.dweight) < 1e-5);
}

TEST_CASE("rmsnorm gives the same bits on every thread count") {
  constexpr int64_t rows = 300;
  constexpr int64_t channels = 200;
  const auto input = random_values(rows * channels, 55);
  const auto weight = random_values(channels, 56);
  const auto doutput = random_values(rows * channels, 57);
  auto run = [&] {
    std::vector<double> output(rows * channels), rstd(rows), dinput(rows * channels);
    std::vector<double> dweight(channels, 0.0);
    backend::cpu::rmsnorm_forward(output.data(), rstd.data(), input.data(), weight.data(), kRmsNormEpsilon,
                                  rows, channels);
    backend::cpu::rmsnorm_backward(dinput.data(), dweight.data(), doutput.data(), input.data(),
                                   weight.data(), rstd.data(), rows, channels);
    dweight.insert(dweight.end(), dinput.begin(), dinput.end());
    dweight.insert(dweight.end(), output.begin(), output.end());
    return dweight;
  };
  const auto [serial, parallel] = on_one_and_three_threads(run);
  CHECK(serial == parallel);
}
