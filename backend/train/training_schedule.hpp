// How long training runs and how the batch size and the learning rate move along it, as
// Megatron-LM decides (megatron/training/arguments.py validate_args, megatron/training/training.py
// update_train_iters and get_optimizer_param_scheduler, megatron/core/num_microbatches_calculator.py):
//
// - Iteration-based (--train-iters): warmup/decay/WSD lengths are iterations × global batch size.
//   Sample-based (--train-samples): they are --lr-*-samples as given, and the number of
//   iterations is derived: train_samples // global batch without ramp-up; with ramp-up, Megatron's
//   update_train_iters walk (iterations while consumed ≤ ramp-up samples and ≤ train samples,
//   each consuming that moment's batch, then (train_samples − consumed) // global batch more).
// - --lr-warmup-fraction f gives warmup = f · decay steps, instead of --lr-warmup-iters/samples.
// - Batch-size ramp-up (--rampup-batch-size START INCREMENT SAMPLES, sample-based only): with
//   n = (global − START) / INCREMENT increments spread evenly over SAMPLES samples,
//     gbs(consumed) = global                                        if consumed > SAMPLES
//                   = START + INCREMENT · floor(consumed / (SAMPLES / n))   otherwise
//   and each iteration runs gbs / (micro batch × dp) micro batches.
//   The batch is constant between increments, so the ramp-up phase is walked one batch size at
//   a time (a run of k iterations at batch b consumes k·b samples), not one iteration at a time:
//   at most n + 1 steps, whatever --train-samples and SAMPLES are; n is capped at
//   kMaxRampupIncrements so that validation stays quick for any value.
// Invalid combinations (iteration- and sample-based flags mixed, warmup not shorter than decay,
// WSD without its decay length, a batch size the micro batches cannot divide, ...) are errors
// naming the flags, where Megatron stops on an assert.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>

#include "backend/optim/lr_scheduler.hpp"
#include "backend/train/arguments.hpp"

namespace backend {

// The most batch-size increments ((--global-batch-size − START) / INCREMENT) a ramp-up may
// have. Real ramps have tens to thousands (GPT-3's: 32 → 1536 by 32, 47); the walk before
// training takes up to one step per increment.
inline constexpr int64_t kMaxRampupIncrements = 1'000'000;

struct BatchSizeRampup {
  int64_t start_global_batch_size = 0;
  int64_t batch_size_increment = 0;
  int64_t rampup_samples = 0;
};

// Megatron's ConstantNumMicroBatchesCalculator / RampupBatchsizeNumMicroBatchesCalculator as a
// function of the consumed samples.
class GlobalBatchSizeSchedule {
 public:
  GlobalBatchSizeSchedule(int64_t global_batch_size, int64_t micro_batch_size,
                          int64_t data_parallel_size, std::optional<BatchSizeRampup> rampup = {});
  int64_t global_batch_size(int64_t consumed_samples) const;
  int64_t num_micro_batches(int64_t consumed_samples) const;
  // During the ramp-up (consumed_samples ≤ SAMPLES): how many increments the batch has grown
  // by, Megatron's int(consumed_samples / rampup_samples_per_increment) in floating point.
  // Never decreases as consumed_samples grows.
  int64_t increments_at(int64_t consumed_samples) const;
  double rampup_samples_per_increment() const { return rampup_samples_per_increment_; }
  int64_t final_global_batch_size() const { return global_batch_size_; }
  const std::optional<BatchSizeRampup>& rampup() const { return rampup_; }

 private:
  int64_t global_batch_size_, micro_batch_size_, data_parallel_size_;
  std::optional<BatchSizeRampup> rampup_;
  double rampup_samples_per_increment_ = 0;
};

GlobalBatchSizeSchedule batch_size_schedule(const TrainingArguments& arguments,
                                            int64_t data_parallel_size = 1);

// A run of ramp-up iterations at one global batch size.
struct RampupSegment {
  int64_t first_iteration = 0;  // counted from 1
  int64_t consumed_before = 0;  // samples consumed before the run's first iteration
  int64_t global_batch_size = 0;
  int64_t iterations = 0;
};
struct RampupEnd {
  int64_t iterations = 0;  // iterations in the ramp-up phase
  int64_t consumed = 0;    // samples consumed by them
};

// The ramp-up phase of a sample-based run, as Megatron's update_train_iters walks it: the
// iterations that start with consumed ≤ SAMPLES and consumed ≤ train_samples, each consuming
// that moment's global batch (the last may end past both). Calls `visit` (if given) for each
// run of iterations at one batch size, in order; O(min(n, iterations)) steps of O(log SAMPLES).
// Samples that would exceed int64 are a common::Error.
RampupEnd walk_rampup(const GlobalBatchSizeSchedule& schedule, int64_t train_samples,
                      const std::function<void(const RampupSegment&)>& visit = {});

// Megatron's update_train_iters for --train-samples.
int64_t sample_based_train_iters(int64_t train_samples, const GlobalBatchSizeSchedule& schedule);

// Applies Megatron's rules for the training length, the batch-size ramp-up, the learning-rate
// and weight-decay schedule flags, and fills the derived values (train_iters from
// --train-samples, lr_decay_iters/samples, start/end weight decay). Called by
// validate_arguments once the global batch size is known.
void resolve_training_schedule(TrainingArguments& arguments, int64_t data_parallel_size);

// Megatron's get_optimizer_param_scheduler: the schedule in samples for resolved arguments.
LearningRateSchedule learning_rate_schedule(const TrainingArguments& arguments);

}  // namespace backend
