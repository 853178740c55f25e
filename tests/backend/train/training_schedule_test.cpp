// Megatron's batch-size ramp-up, sample-based iteration count and scheduler construction,
// against values derived by hand from Megatron's formulas (num_microbatches_calculator.py,
// training.py update_train_iters / get_optimizer_param_scheduler).
#include <doctest/doctest.h>

#include "backend/common/error.hpp"
#include "backend/train/training_schedule.hpp"

using namespace backend;

namespace {
TrainingArguments base_arguments() {
  TrainingArguments a;
  a.micro_batch_size = 2;
  a.global_batch_size = 8;
  a.lr = 1e-3;
  return a;
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
}

TEST_CASE("a ramp-up batch the micro batches cannot divide is found before training") {
  // 2 → 4 by 1 over 4 samples: a batch of 3 after 2 samples; micro batch 2 cannot split it.
  auto a = base_arguments();
  a.global_batch_size = 4;
  a.train_samples = 100;
  a.rampup_batch_size = {2, 1, 4};
  CHECK_THROWS_WITH_AS(resolve_training_schedule(a, 1),
                       doctest::Contains("iteration 2 (after 2 samples) has a global batch of 3"),
                       common::Error);
  // Over 2 samples the 3 is stepped over (2, then 4 at once): Megatron runs it, and so do we.
  a.rampup_batch_size = {2, 1, 2};
  CHECK_NOTHROW(resolve_training_schedule(a, 1));
}

TEST_CASE("iteration-based schedules count iterations × global batch, warmup fraction of decay") {
  auto a = base_arguments();
  a.train_iters = 100;
  a.lr_decay_iters = 80;
  a.lr_warmup_iters = 10;
  a.lr_decay_style = "WSD";
  a.lr_wsd_decay_iters = 20;
  resolve_training_schedule(a, 1);
  auto s = learning_rate_schedule(a);
  CHECK(s.warmup_steps == doctest::Approx(80));
  CHECK(s.decay_steps == 640);
  CHECK(s.wsd_decay_steps == 160);
  CHECK(s.weight_decay_increment_steps == 800);
  CHECK(s.start_weight_decay == doctest::Approx(0.01));  // constant style: --weight-decay
  a.lr_warmup_iters = 0;
  a.lr_warmup_fraction = 0.1;
  s = learning_rate_schedule(a);
  CHECK(s.warmup_steps == doctest::Approx(64));
}

TEST_CASE("sample-based schedules take samples as given and derive train_iters") {
  auto a = base_arguments();
  a.train_samples = 1000;
  a.lr_warmup_samples = 50;
  a.lr_decay_style = "WSD";
  a.lr_wsd_decay_samples = 100;
  a.weight_decay_incr_style = "linear";
  a.start_weight_decay = 0.0;
  a.end_weight_decay = 0.1;
  resolve_training_schedule(a, 1);
  CHECK(a.train_iters == 125);          // 1000 // 8
  CHECK(a.lr_decay_samples == 1000);    // defaults to --train-samples
  const auto s = learning_rate_schedule(a);
  CHECK(s.warmup_steps == doctest::Approx(50));
  CHECK(s.decay_steps == 1000);
  CHECK(s.wsd_decay_steps == 100);
  CHECK(s.weight_decay_increment_steps == 1000);
  CHECK(s.end_weight_decay == doctest::Approx(0.1));
}

TEST_CASE("resolving twice gives the same arguments (derived values are recognised)") {
  auto a = base_arguments();
  a.train_samples = 100;
  a.rampup_batch_size = {4, 2, 16};
  resolve_training_schedule(a, 1);
  const auto once = a;
  resolve_training_schedule(a, 1);
  CHECK(a.train_iters == once.train_iters);
  CHECK(a.lr_decay_samples == once.lr_decay_samples);
  CHECK(a.start_weight_decay == once.start_weight_decay);
}
