// Megatron's grad scalers (megatron/core/optimizer/grad_scaler.py): update sequences checked
// against Megatron's update() worked by hand, the asserts as errors, and the state round trip.
#include "backend/optim/loss_scaler.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "backend/common/error.hpp"

using backend::DynamicLossScaling;
using backend::LossScaler;

namespace {

// One update per entry of `found_inf`; the scale after each.
std::vector<double> scales_after(LossScaler& scaler, const std::vector<bool>& found_inf) {
  std::vector<double> scales;
  for (bool inf : found_inf) {
    scaler.update(inf);
    scales.push_back(scaler.scale());
  }
  return scales;
}

DynamicLossScaling small_scaling() {
  return {.initial_scale = 1024,
          .min_scale = 256,
          .growth_factor = 2,
          .backoff_factor = 0.5,
          .growth_interval = 3,
          .hysteresis = 2};
}

}  // namespace

TEST_CASE("hysteresis 2: the first overflow spends a credit, the second halves, then each one") {
  LossScaler scaler = LossScaler::dynamic(small_scaling());
  CHECK(scaler.dynamic());
  CHECK(scaler.enabled());
  CHECK(scaler.scale() == 1024);
  CHECK(scaler.state() == LossScaler::State{1024, 0, 2});
  scaler.update(true);  // hysteresis tracker 2 → 1: no backoff yet
  CHECK(scaler.state() == LossScaler::State{1024, 0, 1});
  scaler.update(true);  // 1 → 0: halve
  CHECK(scaler.state() == LossScaler::State{512, 0, 0});
  scaler.update(true);  // credits spent: every further overflow halves
  CHECK(scaler.state() == LossScaler::State{256, 0, -1});
  scaler.update(true);  // 128 is below the floor: min_scale
  CHECK(scaler.state() == LossScaler::State{256, 0, -2});
}

TEST_CASE("growth after growth_interval clean steps restores the hysteresis credits") {
  LossScaler scaler = LossScaler::dynamic(small_scaling());
  // inf (credit), inf (512), clean ×3 (1024, credits back), inf (credit), clean, inf (512: the
  // credits return only at growth, so a clean step between two overflows does not reset them).
  CHECK(scales_after(scaler, {true, true, false, false, false, true, false, true}) ==
        std::vector<double>{1024, 512, 512, 512, 1024, 1024, 1024, 512});
  CHECK(scaler.state() == LossScaler::State{512, 0, 0});
  // An overflow resets the growth count: two clean, one inf, three clean before the next growth.
  CHECK(scales_after(scaler, {false, false, true, false, false, false}) ==
        std::vector<double>{512, 512, 256, 256, 256, 512});
  CHECK(scaler.state() == LossScaler::State{512, 0, 2});
}

TEST_CASE("Megatron's defaults: 2^32, doubling after 1000 clean steps") {
  LossScaler scaler = LossScaler::dynamic({});
  CHECK(scaler.scale() == 4294967296.0);
  for (int i = 0; i < 999; ++i) scaler.update(false);
  CHECK(scaler.state() == LossScaler::State{4294967296.0, 999, 2});
  scaler.update(false);
  CHECK(scaler.state() == LossScaler::State{8589934592.0, 0, 2});
  CHECK(scaler.inverse_scale() == std::ldexp(1.0, -33));
}

TEST_CASE("hysteresis 1 backs off at every overflow, down to the floor and no further") {
  LossScaler scaler = LossScaler::dynamic(
      {.initial_scale = 8, .min_scale = 1, .growth_interval = 1000, .hysteresis = 1});
  CHECK(scales_after(scaler, {true, true, true, true, true}) == std::vector<double>{4, 2, 1, 1, 1});
}

TEST_CASE("a constant scaler and none never change") {
  LossScaler constant = LossScaler::constant(128);
  CHECK(constant.kind() == LossScaler::Kind::constant);
  CHECK(constant.enabled());
  CHECK_FALSE(constant.dynamic());
  CHECK(scales_after(constant, {true, true, true, false, false, false, false}) ==
        std::vector<double>(7, 128));
  CHECK(constant.state() == LossScaler::State{128, 0, 0});

  LossScaler none = LossScaler::none();
  CHECK_FALSE(none.enabled());
  CHECK(scales_after(none, {true, true, false}) == std::vector<double>(3, 1.0));
  CHECK(none.inverse_scale() == 1.0);
}

TEST_CASE("the scale is a float32 value, as Megatron's tensor") {
  const double tenth = static_cast<double>(0.1f);
  CHECK(LossScaler::constant(0.1).scale() == tenth);
  CHECK(LossScaler::constant(0.1).inverse_scale() ==
        static_cast<double>(static_cast<float>(1.0 / tenth)));
  // 1/scale of a subnormal float32 scale is beyond float32's range: inf, as Megatron's.
  CHECK(std::isinf(LossScaler::constant(1e-40).inverse_scale()));
  // A growth past float32's range keeps the scale (Megatron's would become inf for good).
  const double largest_power = std::ldexp(1.0, 127);
  LossScaler scaler = LossScaler::dynamic(
      {.initial_scale = largest_power, .min_scale = 1, .growth_interval = 1, .hysteresis = 1});
  scaler.update(false);
  CHECK(scaler.scale() == largest_power);
  CHECK(std::isfinite(scaler.scale()));
}

TEST_CASE("state round trip: a restored scaler continues as the original") {
  LossScaler original = LossScaler::dynamic(small_scaling());
  scales_after(original, {true, false, false});
  const LossScaler::State saved = original.state();
  CHECK(saved == LossScaler::State{1024, 2, 1});

  LossScaler resumed = LossScaler::dynamic(small_scaling());
  resumed.restore(saved);
  CHECK(resumed.state() == saved);
  const std::vector<bool> rest = {false, true, true, false, true, false, false, false};
  CHECK(scales_after(resumed, rest) == scales_after(original, rest));
  CHECK(resumed.state() == original.state());

  // A negative hysteresis tracker (a run of overflows) is restored as it is.
  LossScaler negative = LossScaler::dynamic(small_scaling());
  negative.restore({.scale = 256, .growth_tracker = 0, .hysteresis_tracker = -3});
  CHECK(negative.state() == LossScaler::State{256, 0, -3});

  // A tracker at or past a shorter window grows at the next clean step.
  LossScaler shorter = LossScaler::dynamic(small_scaling());
  shorter.restore({.scale = 512, .growth_tracker = 7, .hysteresis_tracker = 1});
  shorter.update(false);
  CHECK(shorter.state() == LossScaler::State{1024, 0, 2});
}

TEST_CASE("restore: constant and none keep the flags' scale — bad saved values are refused") {
  LossScaler constant = LossScaler::constant(64);
  constant.restore({.scale = 2, .growth_tracker = 5, .hysteresis_tracker = 1});
  CHECK(constant.state() == LossScaler::State{64, 0, 0});
  LossScaler none = LossScaler::none();
  none.restore({.scale = 2, .growth_tracker = 5, .hysteresis_tracker = 1});
  CHECK(none.scale() == 1.0);

  LossScaler dynamic = LossScaler::dynamic(small_scaling());
  for (double scale : {0.0, -1.0, std::nan(""), std::numeric_limits<double>::infinity(), 1e39}) {
    CAPTURE(scale);
    CHECK_THROWS_WITH_AS(
        dynamic.restore({.scale = scale, .growth_tracker = 0, .hysteresis_tracker = 2}),
        doctest::Contains("the saved loss scale"), common::Error);
  }
  CHECK_THROWS_WITH_AS(dynamic.restore({.scale = 8, .growth_tracker = -1, .hysteresis_tracker = 2}),
                       doctest::Contains("growth tracker -1 must be ≥ 0"), common::Error);
  CHECK(dynamic.state() == LossScaler::State{1024, 0, 2});  // unchanged by the refusals
}

TEST_CASE("Megatron's grad-scaler asserts are errors naming the flag") {
  CHECK_THROWS_WITH_AS(LossScaler::constant(0),
                       doctest::Contains("--loss-scale 0 must be a finite number > 0"),
                       common::Error);
  CHECK_THROWS_WITH_AS(LossScaler::constant(-2), doctest::Contains("--loss-scale -2"),
                       common::Error);
  CHECK_THROWS_WITH_AS(
      LossScaler::constant(1e39),
      doctest::Contains("--loss-scale 1e+39 exceeds 3.40282e+38, the largest float32"),
      common::Error);
  CHECK_THROWS_WITH_AS(LossScaler::constant(1e-50),
                       doctest::Contains("below the smallest positive float32"), common::Error);
  auto with = [](auto change) {
    DynamicLossScaling config = small_scaling();
    change(config);
    return config;
  };
  CHECK_THROWS_WITH_AS(LossScaler::dynamic(with([](auto& c) { c.min_scale = 2048; })),
                       doctest::Contains("--min-loss-scale 2048 exceeds --initial-loss-scale 1024"),
                       common::Error);
  CHECK_THROWS_WITH_AS(LossScaler::dynamic(with([](auto& c) { c.min_scale = 0; })),
                       doctest::Contains("--min-loss-scale 0 must be a finite number > 0"),
                       common::Error);
  CHECK_THROWS_WITH_AS(LossScaler::dynamic(with([](auto& c) { c.initial_scale = -1; })),
                       doctest::Contains("--initial-loss-scale -1"), common::Error);
  CHECK_THROWS_WITH_AS(LossScaler::dynamic(with([](auto& c) { c.growth_interval = 0; })),
                       doctest::Contains("--loss-scale-window 0 must be ≥ 1"), common::Error);
  CHECK_THROWS_WITH_AS(LossScaler::dynamic(with([](auto& c) { c.hysteresis = 0; })),
                       doctest::Contains("--hysteresis 0 must be ≥ 1"), common::Error);
  CHECK_THROWS_WITH_AS(LossScaler::dynamic(with([](auto& c) { c.growth_factor = 1; })),
                       doctest::Contains("growth factor 1 must be finite and > 1"), common::Error);
  CHECK_THROWS_WITH_AS(LossScaler::dynamic(with([](auto& c) { c.backoff_factor = 1; })),
                       doctest::Contains("backoff factor 1 must lie in (0, 1)"), common::Error);
  // min == initial is allowed (Megatron asserts min ≤ initial): the scale never backs off.
  LossScaler pinned = LossScaler::dynamic(with([](auto& c) { c.min_scale = 1024; }));
  CHECK(scales_after(pinned, {true, true, true}) == std::vector<double>(3, 1024));
}
