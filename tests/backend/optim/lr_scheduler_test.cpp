// Megatron's OptimizerParamScheduler.get_lr, checked at hand-computed points.
#include <doctest/doctest.h>

#include <cmath>
#include <numbers>
#include <vector>

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
  LearningRateSchedule s{.max_lr = 1e-3,
                         .min_lr = 1e-5,
                         .init_lr = 0,
                         .warmup_steps = 100,
                         .decay_steps = 1000,
                         .decay_style = backend::LearningRateDecayStyle::cosine};
  CHECK(lr_after(s, 0) == doctest::Approx(0.0));
  CHECK(lr_after(s, 25) == doctest::Approx(2.5e-4));
  CHECK(lr_after(s, 100) == doctest::Approx(1e-3));
  s.init_lr = 1e-4;
  CHECK(lr_after(s, 50) == doctest::Approx(1e-4 + 0.5 * 9e-4));
}

TEST_CASE("cosine and linear decay between warmup and decay_steps, then min_lr") {
  LearningRateSchedule s{.max_lr = 1e-3,
                         .min_lr = 1e-4,
                         .init_lr = 0,
                         .warmup_steps = 100,
                         .decay_steps = 1100,
                         .decay_style = backend::LearningRateDecayStyle::cosine};
  const double ratio = (600.0 - 100.0) / 1000.0;
  CHECK(lr_after(s, 600) ==
        doctest::Approx(1e-4 + 0.5 * (std::cos(std::numbers::pi * ratio) + 1) * 9e-4));
  CHECK(lr_after(s, 1100) == doctest::Approx(1e-4));
  CHECK(lr_after(s, 5000) == doctest::Approx(1e-4));
  s.decay_style = backend::LearningRateDecayStyle::linear;
  CHECK(lr_after(s, 600) == doctest::Approx(1e-4 + (1 - ratio) * 9e-4));
  s.decay_style = backend::LearningRateDecayStyle::constant;
  CHECK(lr_after(s, 600) == doctest::Approx(1e-3));
  CHECK(lr_after(s, 5000) == doctest::Approx(1e-3));
}

TEST_CASE("an unknown decay style is refused naming the flag and the valid styles") {
  // The styles are enums; a name is read (from a flag or a checkpoint) through their tables.
  CHECK_THROWS_WITH_AS(
      common::enum_from_name_or_fail<backend::LearningRateDecayStyle>("exponential",
                                                                      "--lr-decay-style"),
      doctest::Contains("--lr-decay-style 'exponential' is not valid (valid: constant, linear, "
                        "cosine, inverse-square-root, WSD)"),
      common::Error);
  CHECK_THROWS_WITH_AS(
      common::enum_from_name_or_fail<backend::WsdDecayStyle>("square", "--lr-wsd-decay-style"),
      doctest::Contains("--lr-wsd-decay-style 'square' is not valid"), common::Error);
  CHECK_THROWS_WITH_AS(common::enum_from_name_or_fail<backend::WeightDecayIncrementStyle>(
                           "step", "--weight-decay-incr-style"),
                       doctest::Contains("--weight-decay-incr-style 'step'"), common::Error);
  CHECK(common::enum_from_name_or_fail<backend::LearningRateDecayStyle>("inverse-square-root",
                                                                        "--lr-decay-style") ==
        backend::LearningRateDecayStyle::inverse_square_root);
}

TEST_CASE("inverse-square-root: max · sqrt(warmup) / sqrt(steps) after warmup, floored at min_lr") {
  LearningRateSchedule s{.max_lr = 1e-3,
                         .min_lr = 1e-4,
                         .init_lr = 0,
                         .warmup_steps = 100,
                         .decay_steps = 100000,
                         .decay_style = backend::LearningRateDecayStyle::inverse_square_root};
  CHECK(lr_after(s, 50) == doctest::Approx(5e-4));          // still the linear warmup
  CHECK(lr_after(s, 400) == doctest::Approx(1e-3 * 10.0 / 20.0));  // sqrt(100)/sqrt(400)
  CHECK(lr_after(s, 10000) == doctest::Approx(1e-4));        // 1e-3 · 10/100 = min exactly
  CHECK(lr_after(s, 40000) == doctest::Approx(1e-4));        // 5e-5 < min: floored
  CHECK(lr_after(s, 100001) == doctest::Approx(1e-4));       // past decay_steps: min_lr
  s.warmup_steps = 0;  // Megatron uses max(warmup, 1) and max(steps, 1)
  CHECK(lr_after(s, 0) == doctest::Approx(1e-3));
  CHECK(lr_after(s, 4) == doctest::Approx(1e-3 / 2.0));
}

TEST_CASE("WSD holds max_lr, then anneals over the last wsd_decay_steps in each style") {
  // warmup 10, decay 110, anneal over the last 40 samples: it starts after sample 70.
  LearningRateSchedule s{.max_lr = 1e-3,
                         .min_lr = 1e-4,
                         .init_lr = 0,
                         .warmup_steps = 10,
                         .decay_steps = 110,
                         .decay_style = backend::LearningRateDecayStyle::wsd,
                         .wsd_decay_steps = 40};
  const double delta = 9e-4;
  for (const char* style : {"exponential", "linear", "cosine", "minus_sqrt"}) {
    CAPTURE(style);
    s.wsd_decay_style = *common::enum_from_name<backend::WsdDecayStyle>(style);
    CHECK(lr_after(s, 5) == doctest::Approx(5e-4));   // warmup
    CHECK(lr_after(s, 40) == doctest::Approx(1e-3));  // stable
    CHECK(lr_after(s, 70) == doctest::Approx(1e-3));  // the last stable sample
    CHECK(lr_after(s, 110) == doctest::Approx(1e-4).epsilon(1e-9));  // w = 1: every style at min
    CHECK(lr_after(s, 111) == doctest::Approx(1e-4));
  }
  // w = (80 − 70) / 40 = 0.25
  s.wsd_decay_style = backend::WsdDecayStyle::linear;
  CHECK(lr_after(s, 80) == doctest::Approx(1e-4 + 0.75 * delta));
  s.wsd_decay_style = backend::WsdDecayStyle::cosine;
  CHECK(lr_after(s, 80) == doctest::Approx(1e-4 + 0.5 * (std::cos(std::numbers::pi / 4) + 1) * delta));
  s.wsd_decay_style = backend::WsdDecayStyle::exponential;
  CHECK(lr_after(s, 80) == doctest::Approx(1e-4 + (2 * std::pow(0.5, 0.25) - 1) * delta));
  s.wsd_decay_style = backend::WsdDecayStyle::minus_sqrt;
  CHECK(lr_after(s, 80) == doctest::Approx(1e-4 + 0.5 * delta));  // 1 − sqrt(0.25)
  // wsd_decay_steps 0 never anneals (scripts use it for a stable-only run).
  s.wsd_decay_steps = 0;
  CHECK(lr_after(s, 110) == doctest::Approx(1e-3));
}

TEST_CASE("a fractional warmup (from --lr-warmup-fraction) is compared and divided as a float") {
  LearningRateSchedule s{.max_lr = 1e-3,
                         .min_lr = 0,
                         .init_lr = 0,
                         .warmup_steps = 2.5,
                         .decay_steps = 10,
                         .decay_style = backend::LearningRateDecayStyle::linear};
  CHECK(lr_after(s, 2) == doctest::Approx(1e-3 * 2 / 2.5));
  CHECK(lr_after(s, 3) == doctest::Approx(1e-3 * (1 - 0.5 / 7.5)));
}

TEST_CASE("weight decay rises from start to end by Megatron's get_wd") {
  LearningRateSchedule s{
      .max_lr = 1e-3,
      .decay_steps = 100,
      .start_weight_decay = 0.0,
      .end_weight_decay = 0.1,
      .weight_decay_increment_steps = 100,
      .weight_decay_increment_style = backend::WeightDecayIncrementStyle::linear};
  auto wd_after = [&](int64_t steps) {
    LearningRateScheduler scheduler(s);
    scheduler.step(steps);
    return scheduler.weight_decay();
  };
  CHECK(wd_after(0) == doctest::Approx(0.0));
  CHECK(wd_after(25) == doctest::Approx(0.025));
  CHECK(wd_after(500) == doctest::Approx(0.1));
  // cosine: 0.5 (cos(π (1 − r)) + 1), 0 → 1 as r 0 → 1
  s.weight_decay_increment_style = backend::WeightDecayIncrementStyle::cosine;
  CHECK(wd_after(25) == doctest::Approx(0.1 * 0.5 * (std::cos(std::numbers::pi * 0.75) + 1)));
  CHECK(wd_after(100) == doctest::Approx(0.1));
  s.weight_decay_increment_style = backend::WeightDecayIncrementStyle::constant;
  s.start_weight_decay = 0.1;
  CHECK(wd_after(25) == doctest::Approx(0.1));
}

TEST_CASE("Megatron's scheduler asserts are errors that say what is wrong") {
  const LearningRateSchedule good{.max_lr = 1e-3,
                                  .min_lr = 1e-4,
                                  .warmup_steps = 10,
                                  .decay_steps = 100,
                                  .decay_style = backend::LearningRateDecayStyle::cosine};
  struct Case {
    LearningRateSchedule schedule;
    const char* message;
  };
  std::vector<Case> cases;
  auto with = [&](auto change, const char* message) {
    LearningRateSchedule s = good;
    change(s);
    cases.push_back({s, message});
  };
  with([](auto& s) { s.warmup_steps = 100; }, "the warmup (100 samples) must be shorter than the decay");
  with([](auto& s) { s.decay_steps = 0; }, "the decay must last at least one sample");
  with([](auto& s) { s.min_lr = 1e-2; }, "need 0 ≤ --min-lr");
  with([](auto& s) { s.init_lr = 1e-2; }, "--lr-warmup-init 0.01 exceeds --lr 0.001");
  with([](auto& s) { s.decay_style = backend::LearningRateDecayStyle::wsd; },
       "--lr-decay-style WSD needs");
  with([](auto& s) { s.end_weight_decay = 0.1; }, "constant needs --start-weight-decay (0) equal");
  with(
      [](auto& s) {
        s.start_weight_decay = 0.2;
        s.end_weight_decay = 0.1;
        s.weight_decay_increment_style = backend::WeightDecayIncrementStyle::linear;
      },
      "need 0 ≤ --start-weight-decay (0.2) ≤ --end-weight-decay (0.1)");
  CHECK_NOTHROW(LearningRateScheduler{good});
  for (const auto& c : cases) {
    CAPTURE(c.message);
    CHECK_THROWS_WITH_AS(LearningRateScheduler{c.schedule}, doctest::Contains(c.message), common::Error);
  }
}
