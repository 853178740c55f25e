// Which loss scaler a run gets from its flags, as Megatron's get_megatron_optimizer builds its
// grad scaler (megatron/core/optimizer/__init__.py) from the mixed-precision flags:
//   --fp16 or --bf16, with --loss-scale S:  constant S (ConstantGradScaler)
//   --fp16 without --loss-scale:            dynamic (DynamicGradScaler): --initial-loss-scale,
//                                           --min-loss-scale, growth 2, backoff 0.5,
//                                           --loss-scale-window, --hysteresis
//   otherwise (bf16 alone, fp32):           none: scale 1.0, never changes
// bf16 with --loss-scale is Megatron's too: its mixed-precision optimizer takes the constant
// scaler whenever --loss-scale is given; fp32 runs use its FP32Optimizer, which has no scaler
// and ignores --loss-scale (validate_arguments warns).
#pragma once

#include "backend/optim/loss_scaler.hpp"
#include "backend/train/arguments.hpp"

namespace backend {

LossScaler make_loss_scaler(const TrainingArguments& arguments);

}  // namespace backend
