// The optimizer's and its schedule's flags as one value: Megatron-LM's learning-rate and
// regularization arguments (megatron/training/arguments.py: _add_learning_rate_args,
// _add_regularization_args) under its dest names, the styles as enums (lr_scheduler.hpp).
// pretrain_gpt's parser fills it from kOptimizerFlags (backend/train/arguments.cpp); the
// training schedule (backend/train/training_schedule.hpp) turns it, with the run's length and
// batch, into the LearningRateSchedule, and adamw_config() into AdamW's settings.
#pragma once

#include <cstdint>
#include <optional>

#include "backend/optim/adamw.hpp"
#include "backend/optim/lr_scheduler.hpp"

namespace backend {

struct OptimizerArguments {
  double lr = 0.0;
  double min_lr = 0.0;
  LearningRateDecayStyle lr_decay_style = LearningRateDecayStyle::linear;
  int64_t lr_warmup_iters = 0;
  int64_t lr_decay_iters = 0;                // 0 → train_iters
  std::optional<double> lr_warmup_fraction;  // of the decay steps, instead of iters/samples
  int64_t lr_warmup_samples = 0;
  int64_t lr_decay_samples = 0;  // sample-based: 0 → train_samples
  WsdDecayStyle lr_wsd_decay_style = WsdDecayStyle::exponential;
  std::optional<int64_t> lr_wsd_decay_iters, lr_wsd_decay_samples;
  double lr_warmup_init = 0.0;
  double weight_decay = 0.01;
  // Filled from --weight-decay when the increment style is constant, as Megatron does.
  std::optional<double> start_weight_decay, end_weight_decay;
  WeightDecayIncrementStyle weight_decay_incr_style = WeightDecayIncrementStyle::constant;
  double clip_grad = 1.0;
  double adam_beta1 = 0.9;
  double adam_beta2 = 0.999;
  double adam_eps = 1e-8;
};

// AdamW's betas, epsilon and decoupled weight decay from the flags.
inline AdamWConfig adamw_config(const OptimizerArguments& optimizer) {
  return {optimizer.adam_beta1, optimizer.adam_beta2, optimizer.adam_eps, optimizer.weight_decay};
}

}  // namespace backend
