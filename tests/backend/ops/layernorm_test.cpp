// layernorm_forward / layernorm_backward: forward against the textbook formula, backward
// against central finite differences in double, float against double; a weight offset of 1
// (--apply-layernorm-1p) computes what weight + 1 computes, with the same weight gradient.
#include "backend/ops/layernorm.hpp"

#include <doctest/doctest.h>
#include <omp.h>

#include "tests/backend/ops/gradient_check.hpp"

namespace {

using namespace backend::testing;

constexpr int64_t kLayerNormRows = 6;
constexpr int64_t kLayerNormChannels = 10;
constexpr double kLayerNormEpsilon = 1e-5;

struct LayernormCase {
  LayernormCase() {
    // An offset per row, so that centring matters.
    for (int64_t r = 0; r < kLayerNormRows; ++r) {
      for (int64_t c = 0; c < kLayerNormChannels; ++c)
        input[r * kLayerNormChannels + c] += 0.5 * static_cast<double>(r);
    }
  }
  std::vector<double> input = random_values(kLayerNormRows * kLayerNormChannels, 21, 2.0);
  std::vector<double> weight = random_values(kLayerNormChannels, 22);
  std::vector<double> bias = random_values(kLayerNormChannels, 23);
  std::vector<double> doutput = random_values(kLayerNormRows * kLayerNormChannels, 24);
  std::vector<double> dweight_start = random_values(kLayerNormChannels, 25);
  std::vector<double> dbias_start = random_values(kLayerNormChannels, 26);
};

struct LayernormResult {
  std::vector<double> output, mean, rstd, dinput, dweight, dbias;
};

template <typename Scalar>
LayernormResult run_layernorm(const LayernormCase& c, double weight_offset = 0.0) {
  const auto input = convert<Scalar>(c.input);
  const auto weight = convert<Scalar>(c.weight);
  const auto bias = convert<Scalar>(c.bias);
  const auto doutput = convert<Scalar>(c.doutput);
  std::vector<Scalar> output(kLayerNormRows * kLayerNormChannels), mean(kLayerNormRows), rstd(kLayerNormRows);
  std::vector<Scalar> dinput(kLayerNormRows * kLayerNormChannels, Scalar{1000});  // must be overwritten
  auto dweight = convert<Scalar>(c.dweight_start);
  auto dbias = convert<Scalar>(c.dbias_start);
  backend::cpu::layernorm_forward(output.data(), mean.data(), rstd.data(), input.data(),
                                  weight.data(), bias.data(), static_cast<Scalar>(weight_offset),
                                  static_cast<Scalar>(kLayerNormEpsilon), kLayerNormRows, kLayerNormChannels);
  backend::cpu::layernorm_backward(dinput.data(), dweight.data(), dbias.data(), doutput.data(),
                                   input.data(), weight.data(), static_cast<Scalar>(weight_offset),
                                   mean.data(), rstd.data(), kLayerNormRows, kLayerNormChannels);
  return {convert<double>(output),
          convert<double>(mean),
          convert<double>(rstd),
          convert<double>(dinput),
          difference(convert<double>(dweight), c.dweight_start),
          difference(convert<double>(dbias), c.dbias_start)};
}

}  // namespace

TEST_CASE("layernorm forward normalises each row with the biased variance") {
  LayernormCase c;
  const LayernormResult result = run_layernorm<double>(c);
  double worst = 0;
  for (int64_t r = 0; r < kLayerNormRows; ++r) {
    const double* x = c.input.data() + r * kLayerNormChannels;
    double mean = 0;
    for (int64_t i = 0; i < kLayerNormChannels; ++i) mean += x[i] / kLayerNormChannels;
    double variance = 0;
    for (int64_t i = 0; i < kLayerNormChannels; ++i) variance += (x[i] - mean) * (x[i] - mean) / kLayerNormChannels;
    const double rstd = 1 / std::sqrt(variance + kLayerNormEpsilon);
    CHECK(result.mean[r] == doctest::Approx(mean).epsilon(1e-12));
    CHECK(result.rstd[r] == doctest::Approx(rstd).epsilon(1e-12));
    for (int64_t i = 0; i < kLayerNormChannels; ++i) {
      const double expected = (x[i] - mean) * rstd * c.weight[i] + c.bias[i];
      worst = std::max(worst, std::abs(result.output[r * kLayerNormChannels + i] - expected));
    }
  }
  CHECK(worst < 1e-12);
}

TEST_CASE("layernorm backward matches central finite differences in double") {
  LayernormCase c;
  const LayernormResult result = run_layernorm<double>(c);
  std::vector<double> output(kLayerNormRows * kLayerNormChannels), mean(kLayerNormRows), rstd(kLayerNormRows);
  auto loss = [&] {
    backend::cpu::layernorm_forward(output.data(), mean.data(), rstd.data(), c.input.data(),
                                    c.weight.data(), c.bias.data(), 0.0, kLayerNormEpsilon, kLayerNormRows,
                                    kLayerNormChannels);
    return dot(output, c.doutput);
  };
  BACKEND_CHECK_GRADIENT(check_gradient(c.input, result.dinput, loss), 1e-6);
  BACKEND_CHECK_GRADIENT(check_gradient(c.weight, result.dweight, loss), 1e-6);
  BACKEND_CHECK_GRADIENT(check_gradient(c.bias, result.dbias, loss), 1e-6);
}

TEST_CASE("layernorm with weight offset 1 (layernorm1p) is layernorm with weight + 1") {
  LayernormCase zero_centred;
  LayernormCase shifted;
  for (double& w : shifted.weight) w += 1.0;
  const LayernormResult one_p = run_layernorm<double>(zero_centred, 1.0);
  const LayernormResult plain = run_layernorm<double>(shifted);
  CHECK(error_relative_to_max(one_p.output, plain.output) < 1e-15);
  CHECK(error_relative_to_max(one_p.dinput, plain.dinput) < 1e-15);
  CHECK(error_relative_to_max(one_p.dweight, plain.dweight) < 1e-15);
  CHECK(error_relative_to_max(one_p.dbias, plain.dbias) < 1e-15);
  // and against finite differences of its own loss
  std::vector<double> output(kLayerNormRows * kLayerNormChannels), mean(kLayerNormRows), rstd(kLayerNormRows);
  auto loss = [&] {
    backend::cpu::layernorm_forward(output.data(), mean.data(), rstd.data(),
                                    zero_centred.input.data(), zero_centred.weight.data(),
                                    zero_centred.bias.data(), 1.0, kLayerNormEpsilon, kLayerNormRows, kLayerNormChannels);
    return dot(output, zero_centred.doutput);
  };
  BACKEND_CHECK_GRADIENT(check_gradient(zero_centred.input, one_p.dinput, loss), 1e-6);
  BACKEND_CHECK_GRADIENT(check_gradient(zero_centred.weight, one_p.dweight, loss), 1e-6);
}

TEST_CASE("layernorm in float matches double") {
  LayernormCase c;
  const LayernormResult single = run_layernorm<float>(c);
  const LayernormResult reference = run_layernorm<double>(c);
  CHECK(error_relative_to_max(single.output, reference.output) < 1e-5);
  CHECK(error_relative_to_max(single.dinput, reference.dinput) < 1e-5);
  CHECK(error_relative_to_max(single.dweight, reference.dweight) < 1e-5);
  CHECK(error_relative_to_max(single.dbias, reference.dbias) < 1e-5);
}

TEST_CASE("layernorm weight and bias sums are the same on every thread count") {
  // Enough rows and channels that the OpenMP loops run in parallel.
  constexpr int64_t rows = 300;
  constexpr int64_t channels = 200;
  const auto input = random_values(rows * channels, 27);
  const auto weight = random_values(channels, 28);
  const auto bias = random_values(channels, 29);
  const auto doutput = random_values(rows * channels, 30);
  auto run = [&] {
    std::vector<double> output(rows * channels), mean(rows), rstd(rows), dinput(rows * channels);
    std::vector<double> gradients(2 * channels, 0.0);
    backend::cpu::layernorm_forward(output.data(), mean.data(), rstd.data(), input.data(),
                                    weight.data(), bias.data(), 0.0, kLayerNormEpsilon, rows, channels);
    backend::cpu::layernorm_backward(dinput.data(), gradients.data(), gradients.data() + channels,
                                     doutput.data(), input.data(), weight.data(), 0.0, mean.data(),
                                     rstd.data(), rows, channels);
    gradients.insert(gradients.end(), dinput.begin(), dinput.end());
    return gradients;
  };
  const auto [serial, parallel] = on_one_and_three_threads(run);
  CHECK(serial == parallel);
}
