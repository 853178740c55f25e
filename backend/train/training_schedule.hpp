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
// Invalid combinations (iteration- and sample-based flags mixed, warmup not shorter than decay,
// WSD without its decay length, a batch size the micro batches cannot divide, ...) are errors
// naming the flags, where Megatron stops on an assert.
#pragma once

#include <cstdint>
#include <optional>

#include "backend/optim/lr_scheduler.hpp"
#include "backend/train/arguments.hpp"

namespace backend {

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
  int64_t final_global_batch_size() const { return global_batch_size_; }
  const std::optional<BatchSizeRampup>& rampup() const { return rampup_; }

 private:
  int64_t global_batch_size_, micro_batch_size_, data_parallel_size_;
  std::optional<BatchSizeRampup> rampup_;
  double rampup_samples_per_increment_ = 0;
};

GlobalBatchSizeSchedule batch_size_schedule(const TrainingArguments& arguments,
                                            int64_t data_parallel_size = 1);

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
