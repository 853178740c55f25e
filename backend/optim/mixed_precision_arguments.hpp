// The mixed-precision flags as one value (Megatron-LM's _add_mixed_precision_args: --bf16,
// --fp16 and the loss scaling's), and which loss scaler a run gets from them, as Megatron's
// get_megatron_optimizer builds its grad scaler (megatron/core/optimizer/__init__.py):
//   --fp16 or --bf16, with --loss-scale S:  constant S (ConstantGradScaler)
//   --fp16 without --loss-scale:            dynamic (DynamicGradScaler): --initial-loss-scale,
//                                           --min-loss-scale, growth 2, backoff 0.5,
//                                           --loss-scale-window, --hysteresis
//   otherwise (bf16 alone, fp32):           none: scale 1.0, never changes
// bf16 with --loss-scale is Megatron's too: its mixed-precision optimizer takes the constant
// scaler whenever --loss-scale is given; fp32 runs use its FP32Optimizer, which has no scaler
// and ignores --loss-scale (pretrain_gpt's validation warns). pretrain_gpt's parser fills the
// value from kPrecisionFlags (backend/train/arguments.cpp). The CPU path computes in fp32
// whatever is asked.
#pragma once

#include <cstdint>
#include <optional>

#include "backend/optim/loss_scaler.hpp"

namespace backend {

struct MixedPrecisionArguments {
  bool bf16 = false;
  bool fp16 = false;
  std::optional<double> loss_scale;          // --loss-scale (None: dynamic with --fp16)
  double initial_loss_scale = 4294967296.0;  // 2^32
  double min_loss_scale = 1.0;
  int64_t loss_scale_window = 1000;  // clean steps before the scale doubles
  int64_t hysteresis = 2;            // overflows before the scale halves
};

LossScaler make_loss_scaler(const MixedPrecisionArguments& precision);

}  // namespace backend
