// The run's loss scaler from its flags; see loss_scaling.hpp.
#include "backend/train/loss_scaling.hpp"

namespace backend {

LossScaler make_loss_scaler(const TrainingArguments& a) {
  const bool mixed_precision = a.fp16 || a.bf16;
  if (mixed_precision && a.loss_scale) return LossScaler::constant(*a.loss_scale);
  if (a.fp16) {
    return LossScaler::dynamic({.initial_scale = a.initial_loss_scale,
                                .min_scale = a.min_loss_scale,
                                .growth_factor = 2.0,
                                .backoff_factor = 0.5,
                                .growth_interval = a.loss_scale_window,
                                .hysteresis = a.hysteresis});
  }
  return LossScaler::none();
}

}  // namespace backend
