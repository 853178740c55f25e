// Megatron's OptimizerParamScheduler.get_lr, checked at hand-computed points.
#include <doctest/doctest.h>

#include <cmath>
#include <numbers>

#include "backend/common/error.hpp"
#include "backend/optim/lr_scheduler.hpp"

using backend::LearningRateSchedule;
using backend::LearningRateScheduler;

namespace {
double lr_after(const LearningRateSchedule& schedule, int64_t steps) {
  LearningRateScheduler scheduler(schedule);
  scheduler.step(steps);
  return scheduler.learning_rate();
}
}  // namespace

TEST_CASE("warmup is linear from init_lr to max_lr, counted in samples") {
  LearningRateSchedule s{.max_lr = 1e-3, .min_lr = 1e-5, .init_lr = 0, .warmup_steps = 100,
                         .decay_steps = 1000, .decay_style = "cosine"};
  CHECK(lr_after(s, 0) == doctest::Approx(0.0));
  CHECK(lr_after(s, 25) == doctest::Approx(2.5e-4));
  CHECK(lr_after(s, 100) == doctest::Approx(1e-3));
  s.init_lr = 1e-4;
  CHECK(lr_after(s, 50) == doctest::Approx(1e-4 + 0.5 * 9e-4));
}

TEST_CASE("cosine and linear decay between warmup and decay_steps, then min_lr") {
  LearningRateSchedule s{.max_lr = 1e-3, .min_lr = 1e-4, .init_lr = 0, .warmup_steps = 100,
                         .decay_steps = 1100, .decay_style = "cosine"};
  const double ratio = (600.0 - 100.0) / 1000.0;
  CHECK(lr_after(s, 600) ==
        doctest::Approx(1e-4 + 0.5 * (std::cos(std::numbers::pi * ratio) + 1) * 9e-4));
  CHECK(lr_after(s, 1100) == doctest::Approx(1e-4));
  CHECK(lr_after(s, 5000) == doctest::Approx(1e-4));
  s.decay_style = "linear";
  CHECK(lr_after(s, 600) == doctest::Approx(1e-4 + (1 - ratio) * 9e-4));
  s.decay_style = "constant";
  CHECK(lr_after(s, 600) == doctest::Approx(1e-3));
  CHECK(lr_after(s, 5000) == doctest::Approx(1e-3));
}

TEST_CASE("an unknown decay style is refused naming the flag and the valid styles") {
  LearningRateSchedule s{.max_lr = 1e-3, .decay_style = "exponential"};
  CHECK_THROWS_WITH_AS(LearningRateScheduler{s},
                       doctest::Contains("--lr-decay-style 'exponential'"), common::Error);
}
