// A training step's scalars on the device (ops/step_scalars.hpp) through the CPU device: the
// loss total the host used to form from forward()'s returned means (the same bits), the
// decision (Megatron's clipping factor, the skip on a non-finite norm, or loss without a
// scaler), and AdamW reading that decision: skipped means not a bit written, the factor the
// same bits as the host's gradient_scale. Bad views are refused by name.
#include "backend/ops/step_scalars.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <span>
#include <vector>

#include "backend/common/error.hpp"
#include "backend/device/cpu_device.hpp"
#include "backend/ops/adamw.hpp"
#include "backend/optim/adamw.hpp"

using namespace backend;

namespace {

View one(double& value) {
  return host_view(std::span(&value, 1));
}

struct Decision {
  double gradient_scale;
  bool skip;
};

Decision decided(double loss, double sum_of_squares, double max_norm, bool loss_decides) {
  CpuDevice device;
  double control[2] = {-7, -7};
  ops::decide_step(device, host_view(std::span<double>(control)), loss_decides ? one(loss) : View{},
                   one(sum_of_squares), max_norm);
  CHECK((control[1] == 0.0 || control[1] == 1.0));
  return {control[0], control[1] != 0.0};
}

}  // namespace

TEST_CASE("accumulate_loss adds each micro batch's mean as the host did: rounded, weighted") {
  CpuDevice device;
  const double micro_totals[] = {7.25, 1.0 / 3.0, 11.0, 0.0};
  const int64_t scored[] = {3, 7, 5, 0};
  for (const bool weighted : {false, true}) {
    for (const bool in_float : {false, true}) {
      CAPTURE(weighted);
      CAPTURE(in_float);
      double total = 0, expected = 0;
      for (size_t m = 0; m < 4; ++m) {
        double micro = micro_totals[m];
        ops::accumulate_loss(device, one(total), one(micro), scored[m], weighted, in_float);
        // What train_step formed from GptModel::forward's returned Scalar before.
        double mean = 0;
        if (scored[m] > 0) {
          mean = micro / static_cast<double>(scored[m]);
          if (in_float) mean = static_cast<float>(mean);
        }
        expected += weighted ? mean * static_cast<double>(scored[m]) : mean;
      }
      CHECK(std::memcmp(&total, &expected, sizeof total) == 0);
    }
  }
  // The count read from the device's memory when the op runs (a captured step's micro batches
  // stage theirs at one address): the same bits as the argument.
  for (const bool weighted : {false, true}) {
    CAPTURE(weighted);
    double by_argument = 0, by_memory = 0, stored = 0;
    for (size_t m = 0; m < 4; ++m) {
      double micro = micro_totals[m];
      stored = static_cast<double>(scored[m]);
      ops::accumulate_loss(device, one(by_argument), one(micro), scored[m], weighted, true);
      ops::accumulate_loss(device, one(by_memory), one(micro), 1000, weighted, true, one(stored));
    }
    CHECK(std::memcmp(&by_memory, &by_argument, sizeof by_memory) == 0);
  }
  // 1/3 in float is not 1/3 in double: the rounding is there.
  double float_total = 0, double_total = 0, third = 1.0;
  ops::accumulate_loss(device, one(float_total), one(third), 3, false, true);
  ops::accumulate_loss(device, one(double_total), one(third), 3, false, false);
  CHECK(float_total != double_total);
  CHECK(float_total == static_cast<double>(1.0f / 3.0f));
}

TEST_CASE("decide_step: Megatron's clipping factor, and a skip on a non-finite norm or loss") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  // norm 5 > max 1: the factor 1 / (5 + 1e-6), rounded to float as ops::scale would.
  const Decision clipped = decided(2.0, 25.0, 1.0, true);
  CHECK_FALSE(clipped.skip);
  CHECK(clipped.gradient_scale == static_cast<double>(static_cast<float>(1.0 / (5.0 + 1e-6))));
  CHECK(clipped.gradient_scale ==
        static_cast<double>(static_cast<float>(*clip_coefficient(5.0, 1.0))));
  // Below the threshold, or clipping off (max_norm ≤ 0): 1.
  CHECK(decided(2.0, 0.25, 1.0, true).gradient_scale == 1.0);
  CHECK(decided(2.0, 25.0, 0.0, true).gradient_scale == 1.0);
  // A non-finite norm skips, with or without a loss scaler.
  CHECK(decided(2.0, nan, 1.0, true).skip);
  CHECK(decided(2.0, inf, 1.0, false).skip);
  // A non-finite loss skips only where the loss decides (no scaler: Megatron's found_inf is
  // the gradients').
  CHECK(decided(nan, 4.0, 1.0, true).skip);
  CHECK(decided(-inf, 4.0, 1.0, true).skip);
  CHECK_FALSE(decided(nan, 4.0, 1.0, false).skip);
  CHECK_FALSE(decided(2.0, 4.0, 1.0, true).skip);
}

TEST_CASE("AdamW with the device's decision: skipped writes nothing, the factor is the host's") {
  CpuDevice device;
  const std::vector<float> master0 = {0.5f, -0.25f, 1.0f, 3.0f, -2.0f};
  const std::vector<float> gradients = {0.1f, -0.3f, 0.7f, 2.0f, -0.01f};
  auto run = [&](std::vector<double> control, float host_scale) {
    std::vector<float> master = master0, m(5, 0.01f), v(5, 0.02f);
    AdamWCoefficients c{.step_size = 1e-2f, .decay = 1e-3f, .gradient_scale = host_scale};
    ops::adamw_update(device, host_view(std::span(master)), View{},
                      host_view(std::span<const float>(gradients)), host_view(std::span(m)),
                      host_view(std::span(v)), coefficients_view(c),
                      control.empty() ? View{} : host_view(std::span<double>(control)));
    master.insert(master.end(), m.begin(), m.end());
    master.insert(master.end(), v.begin(), v.end());
    return master;
  };
  const float factor = static_cast<float>(1.0 / 3.0);
  const std::vector<float> on_host = run({}, factor);
  const std::vector<float> from_device = run({static_cast<double>(factor), 0.0}, 1.0f);
  CHECK(std::memcmp(on_host.data(), from_device.data(), on_host.size() * sizeof(float)) == 0);
  const std::vector<float> skipped = run({static_cast<double>(factor), 1.0}, 1.0f);
  std::vector<float> untouched = master0;
  untouched.insert(untouched.end(), 5, 0.01f);
  untouched.insert(untouched.end(), 5, 0.02f);
  CHECK(std::memcmp(skipped.data(), untouched.data(), skipped.size() * sizeof(float)) == 0);
}

TEST_CASE("the step's scalar ops refuse views that are not their f64 scalars, by name") {
  CpuDevice device;
  double total = 0, value = 1;
  float single = 0;
  double control[2] = {};
  CHECK_THROWS_WITH_AS(ops::add(device, host_view(std::span(&single, 1)), one(value)),
                       doctest::Contains("add: the total must be 1 f64"), common::Error);
  CHECK_THROWS_WITH_AS(ops::accumulate_loss(device, one(total), one(value), -1, false, true),
                       doctest::Contains("accumulate_loss: -1 scored positions"), common::Error);
  CHECK_THROWS_WITH_AS(ops::accumulate_loss(device, one(total), one(value), 1, false, true,
                                            host_view(std::span(&single, 1))),
                       doctest::Contains("accumulate_loss: the stored count must be 1 f64"),
                       common::Error);
  CHECK_THROWS_WITH_AS(ops::decide_step(device, one(total), View{}, one(value), 1.0),
                       doctest::Contains("decide_step: the control must be 2 f64"), common::Error);
  std::vector<float> p(2), g(2), m(2), v(2);
  AdamWCoefficients c;
  CHECK_THROWS_WITH_AS(ops::adamw_update(device, host_view(std::span(p)), View{},
                                         host_view(std::span(g)), host_view(std::span(m)),
                                         host_view(std::span(v)), coefficients_view(c), one(total)),
                       doctest::Contains("adamw_update: the control"), common::Error);
  CHECK_THROWS_WITH_AS(
      ops::adamw_update(device, host_view(std::span(p)), View{}, host_view(std::span(g)),
                        host_view(std::span(m)), host_view(std::span(v)), host_view(std::span(g))),
      doctest::Contains("adamw_update: the coefficients must be an "
                        "AdamWCoefficients (7 fp32), got 2 fp32"),
      common::Error);
  ops::add(device, one(total), one(value));
  CHECK(total == 1.0);
  CHECK_THROWS_WITH_AS(ops::decide_step(device, host_view(std::span<double>(control)), View{},
                                        host_view(std::span(&single, 1)), 1.0),
                       doctest::Contains("decide_step: the sum of squares must be 1 f64"),
                       common::Error);
}
