// Training length, batch-size ramp-up and the schedule's flags, as Megatron; see
// training_schedule.hpp.
#include "backend/train/training_schedule.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <string>

#include "backend/common/checked_math.hpp"
#include "backend/common/error.hpp"

namespace backend {

GlobalBatchSizeSchedule::GlobalBatchSizeSchedule(int64_t global_batch_size,
                                                 int64_t micro_batch_size,
                                                 int64_t data_parallel_size,
                                                 std::optional<BatchSizeRampup> rampup)
    : global_batch_size_(global_batch_size),
      micro_batch_size_(micro_batch_size),
      data_parallel_size_(data_parallel_size),
      rampup_(rampup) {
  if (global_batch_size <= 0 || micro_batch_size <= 0 || data_parallel_size <= 0) {
    common::fail("batch sizes must be positive: --global-batch-size {}, --micro-batch-size {}, "
                 "data-parallel size {}", global_batch_size, micro_batch_size, data_parallel_size);
  }
  if (!rampup) {
    if (global_batch_size % (micro_batch_size * data_parallel_size) != 0) {
      common::fail("--global-batch-size {} is not divisible by --micro-batch-size {} × "
                   "data-parallel size {}", global_batch_size, micro_batch_size, data_parallel_size);
    }
    return;
  }
  const auto& r = *rampup;
  const std::string flag = fmt::format("--rampup-batch-size {} {} {}", r.start_global_batch_size,
                                       r.batch_size_increment, r.rampup_samples);
  if (r.start_global_batch_size <= 0 || r.batch_size_increment <= 0 || r.rampup_samples <= 0) {
    common::fail("{}: the start batch size, the increment and the ramp-up samples must all be "
                 "positive", flag);
  }
  const int64_t difference = global_batch_size - r.start_global_batch_size;
  if (difference < 0) {
    common::fail("{}: the start batch size exceeds --global-batch-size {}", flag, global_batch_size);
  }
  if (difference == 0) {
    common::fail("{}: the start batch size equals --global-batch-size {}, so there is nothing to "
                 "ramp up (drop --rampup-batch-size)", flag, global_batch_size);
  }
  if (difference % r.batch_size_increment != 0) {
    common::fail("{}: --global-batch-size {} minus the start batch size ({}) is not divisible by "
                 "the increment {}", flag, global_batch_size, difference, r.batch_size_increment);
  }
  const int64_t increments = difference / r.batch_size_increment;
  if (increments > kMaxRampupIncrements) {
    common::fail("{}: {} increments from the start batch size to --global-batch-size {}; at most "
                 "{} are supported (the ramp is checked increment by increment before training): "
                 "raise the increment or the start batch size", flag, increments,
                 global_batch_size, kMaxRampupIncrements);
  }
  rampup_samples_per_increment_ =
      static_cast<double>(r.rampup_samples) / static_cast<double>(increments);
}

int64_t GlobalBatchSizeSchedule::global_batch_size(int64_t consumed_samples) const {
  if (!rampup_ || consumed_samples > rampup_->rampup_samples) return global_batch_size_;
  return rampup_->start_global_batch_size +
         increments_at(consumed_samples) * rampup_->batch_size_increment;
}

int64_t GlobalBatchSizeSchedule::increments_at(int64_t consumed_samples) const {
  // Megatron: int(consumed_samples / rampup_samples_per_increment), in floating point.
  return static_cast<int64_t>(static_cast<double>(consumed_samples) /
                              rampup_samples_per_increment_);
}

int64_t GlobalBatchSizeSchedule::num_micro_batches(int64_t consumed_samples) const {
  return global_batch_size(consumed_samples) / (micro_batch_size_ * data_parallel_size_);
}

GlobalBatchSizeSchedule batch_size_schedule(const TrainingArguments& a, int64_t data_parallel_size) {
  std::optional<BatchSizeRampup> rampup;
  if (!a.run.rampup_batch_size.empty()) {
    if (a.run.rampup_batch_size.size() != 3) {
      common::fail("--rampup-batch-size takes three numbers: START INCREMENT SAMPLES");
    }
    rampup = BatchSizeRampup{.start_global_batch_size = a.run.rampup_batch_size[0],
                             .batch_size_increment = a.run.rampup_batch_size[1],
                             .rampup_samples = a.run.rampup_batch_size[2]};
  }
  return GlobalBatchSizeSchedule(a.run.global_batch_size, a.run.micro_batch_size,
                                 data_parallel_size, rampup);
}

namespace {

// The largest consumed count in [from, last] still at `increments` (increments_at(from) ==
// increments; increments_at never decreases). Starts next to where the next increment falls in
// exact arithmetic, (increments + 1) · samples per increment, and brackets the floating-point
// boundary by doubling steps, then bisects: a few evaluations when the estimate is right,
// O(log SAMPLES) at worst.
int64_t last_consumed_at(const GlobalBatchSizeSchedule& schedule, int64_t increments,
                         int64_t from, int64_t last) {
  if (schedule.increments_at(last) <= increments) return last;
  int64_t below = from, above = last;  // increments_at(below) ≤ increments < increments_at(above)
  const double estimate =
      static_cast<double>(increments + 1) * schedule.rampup_samples_per_increment();
  // Compared as doubles first, so the conversion back stays within [below, above].
  const int64_t probe = !(estimate > static_cast<double>(below))  ? below
                        : !(estimate < static_cast<double>(above)) ? above
                                                                   : static_cast<int64_t>(estimate);
  if (schedule.increments_at(probe) <= increments) {
    below = probe;
    for (int64_t step = 1; above - below > step; step *= 2) {
      if (schedule.increments_at(below + step) > increments) {
        above = below + step;
        break;
      }
      below += step;
    }
  } else {
    above = probe;
    for (int64_t step = 1; above - below > step; step *= 2) {
      if (schedule.increments_at(above - step) <= increments) {
        below = above - step;
        break;
      }
      above -= step;
    }
  }
  while (above - below > 1) {
    const int64_t middle = below + (above - below) / 2;
    (schedule.increments_at(middle) <= increments ? below : above) = middle;
  }
  return below;
}

}  // namespace

RampupEnd walk_rampup(const GlobalBatchSizeSchedule& schedule, int64_t train_samples,
                      const std::function<void(const RampupSegment&)>& visit) {
  const BatchSizeRampup& rampup = *schedule.rampup();
  const int64_t last = std::min(rampup.rampup_samples, train_samples);
  const std::string what = fmt::format(
      "the samples of the ramp-up phase (--rampup-batch-size {} {} {} with --train-samples {})",
      rampup.start_global_batch_size, rampup.batch_size_increment, rampup.rampup_samples,
      train_samples);
  RampupEnd end;
  // Each step runs every iteration at the current batch size: those starting at consumed,
  // consumed + batch, ... up to the last count still at this size (and ≤ last).
  while (end.consumed <= last) {
    const int64_t increments = schedule.increments_at(end.consumed);
    const int64_t batch = schedule.global_batch_size(end.consumed);
    const int64_t stays_until = last_consumed_at(schedule, increments, end.consumed, last);
    const int64_t iterations = (stays_until - end.consumed) / batch + 1;
    if (visit) visit({end.iterations + 1, end.consumed, batch, iterations});
    end.iterations += iterations;
    end.consumed = common::checked_add(end.consumed, common::checked_multiply(iterations, batch, what),
                                       what);
  }
  return end;
}

int64_t sample_based_train_iters(int64_t train_samples, const GlobalBatchSizeSchedule& schedule) {
  const int64_t global_batch_size = schedule.final_global_batch_size();
  if (!schedule.rampup()) return train_samples / global_batch_size;
  // The ramp-up phase (its last iteration may end past train_samples, as in Megatron), then
  // whole global batches; a partial last batch is dropped.
  const RampupEnd rampup = walk_rampup(schedule, train_samples);
  int64_t iterations = rampup.iterations;
  if (train_samples > rampup.consumed) {
    iterations += (train_samples - rampup.consumed) / global_batch_size;
  }
  return iterations;
}

namespace {

// Megatron stops when a ramp-up batch size reached during training cannot be split into micro
// batches (update_num_microbatches' consistency check); this finds it before training starts.
void check_rampup_batch_sizes(const TrainingArguments& a, const GlobalBatchSizeSchedule& schedule,
                              int64_t data_parallel_size) {
  // The iterations that run at a ramp-up size are those of the ramp-up phase walk (any after
  // it run at --global-batch-size, which validate_arguments checked).
  const int64_t divisor = a.run.micro_batch_size * data_parallel_size;
  walk_rampup(schedule, a.run.train_samples, [&](const RampupSegment& run) {
    if (run.global_batch_size % divisor != 0) {
      common::fail(
          "--rampup-batch-size {} {} {}: iteration {} (after {} samples) has a global "
          "batch of {}, which --micro-batch-size {} × data-parallel size {} does not "
          "divide; choose a start and increment that are multiples of {}",
          a.run.rampup_batch_size[0], a.run.rampup_batch_size[1], a.run.rampup_batch_size[2],
          run.first_iteration, run.consumed_before, run.global_batch_size, a.run.micro_batch_size,
          data_parallel_size, divisor);
    }
  });
}

// The schedule counts samples and the data path tokens in int64: the run's samples and tokens
// and the evaluations' must fit (the schedule's lengths in samples are checked where
// learning_rate_schedule computes them), or the products wrap and the run misbehaves
// (a negative decay, a hang of 2^62 micro batches). Megatron's Python ints never overflow,
// but no run that large can finish either.
void check_run_fits_counters(const TrainingArguments& a) {
  const int64_t train_samples =
      a.run.train_samples > 0 ? a.run.train_samples
                              : common::checked_multiply(a.run.train_iters, a.run.global_batch_size,
                                                         "--train-iters × --global-batch-size (the "
                                                         "samples the run trains on)");
  common::checked_multiply(train_samples, a.model.seq_length,
                           "the samples the run trains on × --seq-length (its tokens)");
  if (a.evaluation.eval_iters > 0) {
    // Every --eval-interval iterations, and the final validation and test passes.
    const int64_t evaluations =
        a.run.train_iters / std::max<int64_t>(1, a.evaluation.eval_interval) + 2;
    common::checked_multiply(
        {evaluations, a.evaluation.eval_iters, a.run.global_batch_size, a.model.seq_length},
        "evaluations × --eval-iters × --global-batch-size × --seq-length "
        "(the tokens the validation and test passes read)");
  }
}

void refuse_for_mode(bool given, const char* flag, const char* mode_flag, const char* instead) {
  if (given) {
    common::fail("{} does not go with {} (Megatron refuses the mix); use {}", flag, mode_flag,
                 instead);
  }
}

}  // namespace

void resolve_training_schedule(TrainingArguments& a, int64_t data_parallel_size) {
  OptimizerArguments& optimizer = a.optimizer;
  // Each length's own range (≥ 0, or ≥ 1 where 0 would mean "not given") and the warmup
  // fraction's [0, 1) were checked when the flags were parsed (common/flag_rules).

  // Iteration-based or sample-based, never both (Megatron's validate_args). Validating again
  // is harmless: iterations an earlier call derived from --train-samples are derived anew.
  if (a.run.train_iters_derived) a.run.train_iters = 0;
  if (a.run.train_iters > 0 && a.run.train_samples > 0) {
    common::fail(
        "--train-iters {} and --train-samples {} are mutually exclusive: train for a "
        "number of iterations or for a number of samples",
        a.run.train_iters, a.run.train_samples);
  }
  if (a.run.train_iters == 0 && a.run.train_samples == 0) {
    common::fail("pass --train-iters N (iterations) or --train-samples N (samples)");
  }
  const bool sample_based = a.run.train_samples > 0;
  if (!sample_based) {
    const char* mode = "--train-iters";
    refuse_for_mode(optimizer.lr_decay_samples != 0, "--lr-decay-samples", mode,
                    "--lr-decay-iters");
    refuse_for_mode(optimizer.lr_warmup_samples != 0, "--lr-warmup-samples", mode,
                    "--lr-warmup-iters");
    refuse_for_mode(optimizer.lr_wsd_decay_samples.has_value(), "--lr-wsd-decay-samples", mode,
                    "--lr-wsd-decay-iters");
    refuse_for_mode(
        !a.run.rampup_batch_size.empty(), "--rampup-batch-size", mode,
        "--train-samples: Megatron ramps the batch size up only in sample-based training");
    if (optimizer.lr_warmup_fraction && optimizer.lr_warmup_iters != 0) {
      common::fail("--lr-warmup-fraction and --lr-warmup-iters are mutually exclusive: give the "
                   "warmup one way");
    }
  } else {
    const char* mode = "--train-samples";
    refuse_for_mode(optimizer.lr_decay_iters != 0, "--lr-decay-iters", mode, "--lr-decay-samples");
    refuse_for_mode(optimizer.lr_warmup_iters != 0, "--lr-warmup-iters", mode,
                    "--lr-warmup-samples");
    refuse_for_mode(optimizer.lr_wsd_decay_iters.has_value(), "--lr-wsd-decay-iters", mode,
                    "--lr-wsd-decay-samples");
    if (optimizer.lr_warmup_fraction && optimizer.lr_warmup_samples != 0) {
      common::fail("--lr-warmup-fraction and --lr-warmup-samples are mutually exclusive: give the "
                   "warmup one way");
    }
  }

  const GlobalBatchSizeSchedule batches = batch_size_schedule(a, data_parallel_size);
  if (sample_based) {
    a.run.train_iters = sample_based_train_iters(a.run.train_samples, batches);
    a.run.train_iters_derived = true;
    if (a.run.train_iters == 0) {
      common::fail("--train-samples {} is less than one global batch ({}): nothing to train",
                   a.run.train_samples, batches.global_batch_size(0));
    }
    if (batches.rampup()) check_rampup_batch_sizes(a, batches, data_parallel_size);
    if (optimizer.lr_decay_samples == 0) optimizer.lr_decay_samples = a.run.train_samples;
    if (!optimizer.lr_warmup_fraction &&
        optimizer.lr_warmup_samples >= optimizer.lr_decay_samples) {
      common::fail(
          "--lr-warmup-samples {} must be smaller than --lr-decay-samples {} (which "
          "defaults to --train-samples)",
          optimizer.lr_warmup_samples, optimizer.lr_decay_samples);
    }
  } else {
    if (optimizer.lr_decay_iters == 0) optimizer.lr_decay_iters = a.run.train_iters;
    if (!optimizer.lr_warmup_fraction && optimizer.lr_warmup_iters >= optimizer.lr_decay_iters) {
      common::fail(
          "--lr-warmup-iters {} must be smaller than --lr-decay-iters {} (which defaults "
          "to --train-iters)",
          optimizer.lr_warmup_iters, optimizer.lr_decay_iters);
    }
  }
  if (optimizer.lr_decay_style == LearningRateDecayStyle::wsd &&
      !(sample_based ? optimizer.lr_wsd_decay_samples : optimizer.lr_wsd_decay_iters)) {
    common::fail("--lr-decay-style WSD needs the length of its final decay: {} N",
                 sample_based ? "--lr-wsd-decay-samples" : "--lr-wsd-decay-iters");
  }
  check_run_fits_counters(a);
  if (optimizer.lr_warmup_init > optimizer.lr) {
    common::fail("--lr-warmup-init {} must not exceed --lr {}", optimizer.lr_warmup_init,
                 optimizer.lr);
  }

  // Weight decay: constant takes --weight-decay; linear and cosine need both ends.
  if (optimizer.weight_decay_incr_style == WeightDecayIncrementStyle::constant) {
    const bool filled_before = optimizer.start_weight_decay == optimizer.weight_decay &&
                               optimizer.end_weight_decay == optimizer.weight_decay;
    if ((optimizer.start_weight_decay || optimizer.end_weight_decay) && !filled_before) {
      common::fail("--start-weight-decay/--end-weight-decay need --weight-decay-incr-style linear "
                   "or cosine (constant uses --weight-decay)");
    }
    optimizer.start_weight_decay = optimizer.end_weight_decay = optimizer.weight_decay;
  } else if (!optimizer.start_weight_decay || !optimizer.end_weight_decay) {
    common::fail(
        "--weight-decay-incr-style {} needs both --start-weight-decay and "
        "--end-weight-decay",
        common::enum_name(optimizer.weight_decay_incr_style));
  }
  // The remaining asserts of Megatron's OptimizerParamScheduler (in samples).
  const LearningRateScheduler checked(learning_rate_schedule(a));
  (void)checked;
}

LearningRateSchedule learning_rate_schedule(const TrainingArguments& a) {
  const OptimizerArguments& optimizer = a.optimizer;
  LearningRateSchedule s;
  s.max_lr = optimizer.lr;
  s.min_lr = optimizer.min_lr;
  s.init_lr = optimizer.lr_warmup_init;
  s.decay_style = optimizer.lr_decay_style;
  s.wsd_decay_style = optimizer.lr_wsd_decay_style;
  s.start_weight_decay = optimizer.start_weight_decay.value_or(optimizer.weight_decay);
  s.end_weight_decay = optimizer.end_weight_decay.value_or(optimizer.weight_decay);
  s.weight_decay_increment_style = optimizer.weight_decay_incr_style;
  if (a.run.train_samples > 0) {
    s.decay_steps = optimizer.lr_decay_samples;
    s.weight_decay_increment_steps = a.run.train_samples;
    s.wsd_decay_steps = optimizer.lr_wsd_decay_samples.value_or(-1);
    s.warmup_steps = static_cast<double>(optimizer.lr_warmup_samples);
  } else {
    // Iterations in samples: × the global batch size, checked (check_run_fits_counters).
    const int64_t batch = a.run.global_batch_size;
    auto in_samples = [batch](int64_t iterations, const char* flag) {
      return common::checked_multiply(iterations, batch,
                                      fmt::format("{} × --global-batch-size (in samples)", flag));
    };
    s.decay_steps = in_samples(optimizer.lr_decay_iters, "--lr-decay-iters");
    s.weight_decay_increment_steps = in_samples(a.run.train_iters, "--train-iters");
    s.wsd_decay_steps = optimizer.lr_wsd_decay_iters
                            ? in_samples(*optimizer.lr_wsd_decay_iters, "--lr-wsd-decay-iters")
                            : -1;
    s.warmup_steps =
        static_cast<double>(in_samples(optimizer.lr_warmup_iters, "--lr-warmup-iters"));
  }
  if (optimizer.lr_warmup_fraction) {
    s.warmup_steps = *optimizer.lr_warmup_fraction * static_cast<double>(s.decay_steps);
  }
  return s;
}

}  // namespace backend
