// Megatron's batch-size ramp-up, sample-based iteration count and scheduler construction,
// against values derived by hand from Megatron's formulas (num_microbatches_calculator.py,
// training.py update_train_iters / get_optimizer_param_scheduler).
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <limits>
#include <string>
#include <vector>

#include "backend/common/error.hpp"
#include "backend/common/splitmix64.hpp"
#include "backend/train/training_schedule.hpp"

using namespace backend;

namespace {
TrainingArguments base_arguments() {
  TrainingArguments a;
  a.run.micro_batch_size = 2;
  a.run.global_batch_size = 8;
  a.optimizer.lr = 1e-3;
  return a;
}

// Megatron's update_train_iters ramp-up phase one iteration at a time: the batch of every
// iteration that starts with consumed ≤ SAMPLES and ≤ train samples.
struct StepByStep {
  std::vector<int64_t> batches;
  int64_t consumed = 0;
};
StepByStep walk_one_iteration_at_a_time(const GlobalBatchSizeSchedule& schedule,
                                        int64_t train_samples) {
  StepByStep walk;
  while (walk.consumed <= schedule.rampup()->rampup_samples && walk.consumed <= train_samples) {
    walk.batches.push_back(schedule.global_batch_size(walk.consumed));
    walk.consumed += walk.batches.back();
  }
  return walk;
}

// The walk by runs of one batch size, expanded to one batch per iteration; checks that the
// runs follow one another.
StepByStep walk_by_runs(const GlobalBatchSizeSchedule& schedule, int64_t train_samples) {
  StepByStep walk;
  const RampupEnd end = walk_rampup(schedule, train_samples, [&](const RampupSegment& run) {
    REQUIRE(run.first_iteration == static_cast<int64_t>(walk.batches.size()) + 1);
    REQUIRE(run.consumed_before == walk.consumed);
    REQUIRE(run.iterations >= 1);
    walk.batches.insert(walk.batches.end(), static_cast<size_t>(run.iterations), run.global_batch_size);
    walk.consumed += run.iterations * run.global_batch_size;
  });
  CHECK(end.iterations == static_cast<int64_t>(walk.batches.size()));
  CHECK(end.consumed == walk.consumed);
  return walk;
}

// One ramp-up against the step-by-step walk: the batches, the iteration count, and the first
// iteration whose batch `micro_batch_size` cannot divide.
void check_against_step_by_step(int64_t global, BatchSizeRampup rampup, int64_t train_samples,
                                int64_t micro_batch_size) {
  CAPTURE(global);
  CAPTURE(rampup.start_global_batch_size);
  CAPTURE(rampup.batch_size_increment);
  CAPTURE(rampup.rampup_samples);
  CAPTURE(train_samples);
  const GlobalBatchSizeSchedule schedule(global, 1, 1, rampup);
  const StepByStep expected = walk_one_iteration_at_a_time(schedule, train_samples);
  const StepByStep by_runs = walk_by_runs(schedule, train_samples);
  REQUIRE(by_runs.batches == expected.batches);
  const int64_t expected_iterations =
      static_cast<int64_t>(expected.batches.size()) +
      (train_samples > expected.consumed ? (train_samples - expected.consumed) / global : 0);
  CHECK(sample_based_train_iters(train_samples, schedule) == expected_iterations);

  TrainingArguments a;
  a.optimizer.lr = 1e-3;
  a.run.micro_batch_size = micro_batch_size;
  a.run.global_batch_size = global;
  a.run.train_samples = train_samples;
  a.run.rampup_batch_size = {rampup.start_global_batch_size, rampup.batch_size_increment,
                             rampup.rampup_samples};
  size_t bad = 0;
  while (bad < expected.batches.size() && expected.batches[bad] % micro_batch_size == 0) ++bad;
  if (expected_iterations == 0) {
    CHECK_THROWS_WITH_AS(resolve_training_schedule(a, 1), doctest::Contains("nothing to train"),
                         common::Error);
  } else if (bad == expected.batches.size()) {
    CHECK_NOTHROW(resolve_training_schedule(a, 1));
    CHECK(a.run.train_iters == expected_iterations);
  } else {
    int64_t consumed_before = 0;
    for (size_t i = 0; i < bad; ++i) consumed_before += expected.batches[i];
    const std::string message = fmt::format("iteration {} (after {} samples) has a global batch of {},",
                                            bad + 1, consumed_before, expected.batches[bad]);
    CHECK_THROWS_WITH_AS(resolve_training_schedule(a, 1), doctest::Contains(message.c_str()),
                         common::Error);
  }
}
}  // namespace

TEST_CASE("the ramp-up grows the global batch by the increment every SAMPLES / n samples") {
  // 8 → 32 by 8: n = 3 increments over 300 samples, one every 100 samples.
  const GlobalBatchSizeSchedule schedule(32, 2, 1, BatchSizeRampup{8, 8, 300});
  CHECK(schedule.global_batch_size(0) == 8);
  CHECK(schedule.global_batch_size(99) == 8);
  CHECK(schedule.global_batch_size(100) == 16);
  CHECK(schedule.global_batch_size(250) == 24);
  CHECK(schedule.global_batch_size(300) == 32);
  CHECK(schedule.global_batch_size(301) == 32);
  CHECK(schedule.global_batch_size(1000000) == 32);
  CHECK(schedule.num_micro_batches(100) == 8);
  CHECK(schedule.num_micro_batches(0) == 4);
  const GlobalBatchSizeSchedule constant(32, 2, 2);
  CHECK(constant.global_batch_size(12345) == 32);
  CHECK(constant.num_micro_batches(0) == 8);  // 32 / (2 × dp 2)
}

TEST_CASE("--train-samples gives Megatron's iteration count, with and without ramp-up") {
  CHECK(sample_based_train_iters(1000, GlobalBatchSizeSchedule(32, 2, 1)) == 31);  // 1000 // 32
  // Ramp-up: 13 iterations of 8 (to 104 samples), 6 of 16 (to 200), 5 of 24 (the last starts
  // at 296 ≤ 300 and ends at 320), then (1000 − 320) // 32 = 21 full batches: 45.
  CHECK(sample_based_train_iters(1000, GlobalBatchSizeSchedule(32, 2, 1, BatchSizeRampup{8, 8, 300})) == 45);
  // Training shorter than the ramp: iterations while consumed ≤ train samples (0, 8, 16, 24).
  CHECK(sample_based_train_iters(24, GlobalBatchSizeSchedule(32, 2, 1, BatchSizeRampup{8, 8, 300})) == 4);
}

TEST_CASE("the ramp-up walked by runs of one batch size matches the walk one iteration at a time") {
  // Every small ramp-up: all start/increment pairs up to a global batch of 16, ramp-ups over 1
  // to 40 samples (increments that fall between whole samples, several per batch, several
  // batches per increment), training shorter and longer than the ramp.
  for (int64_t global = 2; global <= 16; ++global) {
    for (int64_t start = 1; start < global; ++start) {
      for (int64_t increment = 1; increment <= global - start; ++increment) {
        if ((global - start) % increment != 0) continue;
        for (int64_t samples = 1; samples <= 40; ++samples) {
          for (int64_t train_samples : {1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 200}) {
            check_against_step_by_step(global, {start, increment, samples}, train_samples,
                                       1 + (global + samples + train_samples) % 3);
          }
        }
      }
    }
  }
  // Larger sizes, where the floating-point increment boundaries are not whole samples.
  for (uint64_t i = 0; i < 300; ++i) {
    const auto pick = [i](uint64_t which, int64_t bound) {
      return static_cast<int64_t>(common::splitmix64_at(which, i) % static_cast<uint64_t>(bound)) + 1;
    };
    const int64_t start = pick(1, 64), increment = pick(2, 16), increments = pick(3, 200);
    const int64_t samples = pick(4, 200000), train_samples = pick(5, 300000);
    check_against_step_by_step(start + increment * increments, {start, increment, samples},
                               train_samples, pick(6, 4));
  }
}

TEST_CASE("a ramp-up over 2^61 samples is counted without walking its iterations") {
  // One increment at 2^61 samples, as Megatron computes it: float(consumed) / 2^61, and every
  // count from 2^61 − 128 on rounds to 2^61 as a double. So 2^60 − 64 iterations of 2 (to
  // 2^61 − 128), 33 of 4 (the last starts at 2^61 and ends at 2^61 + 4), then
  // (2^62 − 2^61 − 4) // 4 = 2^59 − 1 of 4.
  const GlobalBatchSizeSchedule schedule(4, 2, 1, BatchSizeRampup{2, 2, int64_t{1} << 61});
  CHECK(sample_based_train_iters(int64_t{1} << 62, schedule) ==
        (int64_t{1} << 60) - 64 + 33 + (int64_t{1} << 59) - 1);
  // The most increments allowed, over almost every sample int64 counts: one step per run.
  const int64_t largest = std::numeric_limits<int64_t>::max();
  const GlobalBatchSizeSchedule widest(2 + 2 * kMaxRampupIncrements, 2, 1,
                                       BatchSizeRampup{2, 2, largest / 2});
  int64_t runs = 0, previous_batch = 0;
  const RampupEnd end = walk_rampup(widest, largest / 2, [&](const RampupSegment& run) {
    ++runs;
    CHECK(run.global_batch_size > previous_batch);
    previous_batch = run.global_batch_size;
  });
  // One run per batch size; the last increment is due at SAMPLES itself, where floating point
  // may place it just past.
  CHECK(runs >= kMaxRampupIncrements);
  CHECK(runs <= kMaxRampupIncrements + 1);
  CHECK(end.consumed > largest / 2);
  // Ramp-up samples that end past what int64 counts are refused, not wrapped.
  const GlobalBatchSizeSchedule to_the_end(4, 2, 1, BatchSizeRampup{2, 2, largest});
  CHECK_THROWS_WITH_AS(sample_based_train_iters(largest, to_the_end),
                       doctest::Contains("the samples of the ramp-up phase (--rampup-batch-size 2 "
                                         "2 9223372036854775807 with --train-samples"),
                       common::Error);
}

TEST_CASE("the ramp-up is refused where Megatron would stop, naming the flag") {
  auto make = [](int64_t global, BatchSizeRampup rampup) {
    return GlobalBatchSizeSchedule(global, 2, 1, rampup);
  };
  CHECK_THROWS_WITH_AS(make(8, {8, 2, 100}), doctest::Contains("nothing to ramp up"), common::Error);
  CHECK_THROWS_WITH_AS(make(8, {10, 2, 100}), doctest::Contains("exceeds --global-batch-size 8"),
                       common::Error);
  CHECK_THROWS_WITH_AS(make(8, {2, 4, 100}),
                       doctest::Contains("--rampup-batch-size 2 4 100: --global-batch-size 8 minus "
                                         "the start batch size (6) is not divisible by the increment 4"),
                       common::Error);
  CHECK_THROWS_WITH_AS(make(8, {2, 2, 0}), doctest::Contains("must all be positive"), common::Error);
  // More increments than the walk before training takes steps for.
  CHECK_NOTHROW(make(2 + 2 * kMaxRampupIncrements, {2, 2, 100}));
  CHECK_THROWS_WITH_AS(make(4 + 2 * kMaxRampupIncrements, {2, 2, 100}),
                       doctest::Contains("--rampup-batch-size 2 2 100: 1000001 increments from the "
                                         "start batch size to --global-batch-size 2000004; at most "
                                         "1000000 are supported"),
                       common::Error);
  CHECK_THROWS_WITH_AS(make(9223372036854775806, {2, 2, 100}),
                       doctest::Contains("at most 1000000 are supported"), common::Error);
}

TEST_CASE("a ramp-up batch the micro batches cannot divide is found before training") {
  // 2 → 4 by 1 over 4 samples: a batch of 3 after 2 samples; micro batch 2 cannot split it.
  auto a = base_arguments();
  a.run.global_batch_size = 4;
  a.run.train_samples = 100;
  a.run.rampup_batch_size = {2, 1, 4};
  CHECK_THROWS_WITH_AS(resolve_training_schedule(a, 1),
                       doctest::Contains("iteration 2 (after 2 samples) has a global batch of 3"),
                       common::Error);
  // Over 2 samples the 3 is stepped over (2, then 4 at once): Megatron runs it, and so do we.
  a.run.rampup_batch_size = {2, 1, 2};
  CHECK_NOTHROW(resolve_training_schedule(a, 1));
}

TEST_CASE("iteration-based schedules count iterations × global batch, warmup fraction of decay") {
  auto a = base_arguments();
  a.run.train_iters = 100;
  a.optimizer.lr_decay_iters = 80;
  a.optimizer.lr_warmup_iters = 10;
  a.optimizer.lr_decay_style = backend::LearningRateDecayStyle::wsd;
  a.optimizer.lr_wsd_decay_iters = 20;
  resolve_training_schedule(a, 1);
  auto s = learning_rate_schedule(a);
  CHECK(s.warmup_steps == doctest::Approx(80));
  CHECK(s.decay_steps == 640);
  CHECK(s.wsd_decay_steps == 160);
  CHECK(s.weight_decay_increment_steps == 800);
  CHECK(s.start_weight_decay == doctest::Approx(0.01));  // constant style: --weight-decay
  a.optimizer.lr_warmup_iters = 0;
  a.optimizer.lr_warmup_fraction = 0.1;
  s = learning_rate_schedule(a);
  CHECK(s.warmup_steps == doctest::Approx(64));
}

TEST_CASE("sample-based schedules take samples as given and derive train_iters") {
  auto a = base_arguments();
  a.run.train_samples = 1000;
  a.optimizer.lr_warmup_samples = 50;
  a.optimizer.lr_decay_style = backend::LearningRateDecayStyle::wsd;
  a.optimizer.lr_wsd_decay_samples = 100;
  a.optimizer.weight_decay_incr_style = backend::WeightDecayIncrementStyle::linear;
  a.optimizer.start_weight_decay = 0.0;
  a.optimizer.end_weight_decay = 0.1;
  resolve_training_schedule(a, 1);
  CHECK(a.run.train_iters == 125);              // 1000 // 8
  CHECK(a.optimizer.lr_decay_samples == 1000);  // defaults to --train-samples
  const auto s = learning_rate_schedule(a);
  CHECK(s.warmup_steps == doctest::Approx(50));
  CHECK(s.decay_steps == 1000);
  CHECK(s.wsd_decay_steps == 100);
  CHECK(s.weight_decay_increment_steps == 1000);
  CHECK(s.end_weight_decay == doctest::Approx(0.1));
}

TEST_CASE("resolving twice gives the same arguments (derived values are recognised)") {
  auto a = base_arguments();
  a.run.train_samples = 100;
  a.run.rampup_batch_size = {4, 2, 16};
  resolve_training_schedule(a, 1);
  const auto once = a;
  resolve_training_schedule(a, 1);
  CHECK(a.run.train_iters == once.run.train_iters);
  CHECK(a.optimizer.lr_decay_samples == once.optimizer.lr_decay_samples);
  CHECK(a.optimizer.start_weight_decay == once.optimizer.start_weight_decay);
}
