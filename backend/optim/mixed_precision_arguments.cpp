// The run's loss scaler from its flags; see mixed_precision_arguments.hpp.
#include "backend/optim/mixed_precision_arguments.hpp"

namespace backend {

LossScaler make_loss_scaler(const MixedPrecisionArguments& precision) {
  const bool mixed_precision = precision.fp16 || precision.bf16;
  if (mixed_precision && precision.loss_scale) return LossScaler::constant(*precision.loss_scale);
  if (precision.fp16) {
    return LossScaler::dynamic({.initial_scale = precision.initial_loss_scale,
                                .min_scale = precision.min_loss_scale,
                                .growth_factor = 2.0,
                                .backoff_factor = 0.5,
                                .growth_interval = precision.loss_scale_window,
                                .hysteresis = precision.hysteresis});
  }
  return LossScaler::none();
}

}  // namespace backend
