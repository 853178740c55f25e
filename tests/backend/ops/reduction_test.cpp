// count_zeros (--log-num-zeros-in-grad): exact counts with +0 and −0 counted, NaN, infinities
// and the smallest subnormal not, in float and double, on any thread count; and through the CPU
// device, times a clipping factor read from memory (what it underflows counts).
#include "backend/ops/reduction.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <span>
#include <vector>

#include "backend/common/error.hpp"
#include "backend/device/cpu_device.hpp"
#include "tests/backend/ops/gradient_check.hpp"

namespace {

template <typename Scalar>
std::vector<Scalar> values_with_zeros(int64_t count, int64_t* zeros) {
  std::vector<Scalar> values(static_cast<size_t>(count));
  *zeros = 0;
  for (int64_t i = 0; i < count; ++i) {
    Scalar value = static_cast<Scalar>(1 + i % 7) * Scalar(0.25);
    if (i % 5 == 0) value = Scalar{0};
    if (i % 11 == 0) value = -Scalar{0};
    if (i % 13 == 0) value = std::numeric_limits<Scalar>::quiet_NaN();
    if (i % 17 == 0) value = std::numeric_limits<Scalar>::infinity();
    if (i % 19 == 0) value = std::numeric_limits<Scalar>::denorm_min();
    values[static_cast<size_t>(i)] = value;
    *zeros += value == Scalar{0} ? 1 : 0;
  }
  return values;
}

}  // namespace

TEST_CASE("count_zeros counts +0 and −0 exactly, not NaN, infinities or subnormals") {
  for (const int64_t count : {int64_t{0}, int64_t{1}, int64_t{1000}, int64_t{300001}}) {
    CAPTURE(count);
    int64_t expected = 0;
    const auto floats = values_with_zeros<float>(count, &expected);
    double total = -1;
    backend::cpu::count_zeros(&total, floats.data(), count);
    CHECK(total == static_cast<double>(expected));
    const auto doubles = values_with_zeros<double>(count, &expected);
    backend::cpu::count_zeros(&total, doubles.data(), count);
    CHECK(total == static_cast<double>(expected));
    if (count == 300001) {
      CHECK(expected > 60000);
      const auto [serial, parallel] = backend::testing::on_one_and_three_threads([&] {
        double counted = 0;
        backend::cpu::count_zeros(&counted, floats.data(), count);
        return counted;
      });
      CHECK(serial == parallel);
    }
  }
  backend::CpuDevice device;
  int64_t expected = 0;
  auto values = values_with_zeros<float>(4099, &expected);
  double total = 0;
  backend::ops::count_zeros(device, backend::host_view(std::span(&total, 1)),
                            backend::host_view(std::span(values)));
  CHECK(total == static_cast<double>(expected));
  // Times a clipping factor read from memory, in the element type: what underflows counts.
  const float tiny = 3e-38F;
  values[1] = tiny;
  values[2] = -tiny;
  values[3] = 0.25F;
  int64_t expected_clipped = 0;
  for (const float value : values) expected_clipped += value * 1e-8F == 0.0F ? 1 : 0;
  CHECK(expected_clipped > expected + 2);  // the subnormals too
  double factor = 1e-8;
  const auto factor_view = backend::host_view(std::span(&factor, 1));
  backend::ops::count_zeros(device, backend::host_view(std::span(&total, 1)),
                            backend::host_view(std::span(values)), factor_view);
  CHECK(total == static_cast<double>(expected_clipped));
  factor = 1;
  backend::ops::count_zeros(device, backend::host_view(std::span(&total, 1)),
                            backend::host_view(std::span(values)), factor_view);
  CHECK(total == static_cast<double>(expected));
  double two_factors[2] = {1, 1};
  CHECK_THROWS_AS(backend::ops::count_zeros(device, backend::host_view(std::span(&total, 1)),
                                            backend::host_view(std::span(values)),
                                            backend::host_view(std::span<double>(two_factors))),
                  common::Error);
  double two_totals[2] = {};
  CHECK_THROWS_WITH_AS(
      backend::ops::count_zeros(device, backend::host_view(std::span<double>(two_totals)),
                                backend::host_view(std::span(values))),
      doctest::Contains("count_zeros: the total must be one f64"), common::Error);
}
