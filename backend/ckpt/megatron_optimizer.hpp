// The optimizer and learning-rate scheduler state of a Megatron-LM legacy checkpoint's
// model_optim_rng.pt (megatron/core/optimizer/optimizer.py and optimizer_param_scheduler.py,
// their state_dict methods), read into what this backend's checkpoints keep.
//
// 'optimizer' is one of:
//   FP32Optimizer (an fp32 run)   torch's Adam state dict itself:
//                                 {'state': {i: {'step', 'exp_avg', 'exp_avg_sq'}},
//                                  'param_groups': [{..., 'params': [i, ...]}, ...]}
//   Float16OptimizerWithFloat16Params (--bf16, --fp16)
//                                 {'optimizer': that dict, 'grad_scaler': {...} (fp16 only),
//                                  'fp32_from_fp16_params': [[main weight of each parameter of
//                                  group k] for each group k]}
//   DistributedOptimizer          {'optimizer': {'param_groups': [...]} without 'state'}: the
//                                 moments are in distrib_optim.pt, not read yet
//   ChainedOptimizer of several   a list of the above: not read yet
// Torch numbers the parameters across the groups in order. Megatron's groups
// (megatron/core/optimizer/__init__.py: _get_param_groups) hold the model's parameters in the
// order of named_parameters(), which is the model state dict's order, split by weight decay: the
// biases and 1-D parameters in a group with wd_mult 0 (before wd_mult: weight_decay 0), the rest
// in another; which group comes first has changed between versions, so each group is matched
// by its wd_mult. A group whose parameter count is not its class's (another split: --decoupled-lr,
// per-parameter overrides) is refused, and so is a moment whose shape is not its parameter's.
//
// 'opt_param_scheduler' is OptimizerParamScheduler.state_dict(), in samples: max_lr,
// lr_warmup_steps, num_steps, lr_decay_style, lr_decay_steps, min_lr, start_wd, end_wd,
// wd_incr_style, wd_incr_steps (and the older keys its load_state_dict still reads: start_lr,
// warmup_iter, warmup_steps, end_iter, decay_steps, decay_style). The warmup's initial rate
// and the WSD anneal are not in it; they come from the args, as Megatron's scheduler takes them.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "backend/ckpt/megatron_checkpoint.hpp"
#include "backend/ckpt/torch_checkpoint.hpp"

namespace backend {

// One parameter of a rank file's model, in the state dict's order.
struct MegatronParameter {
  std::string megatron_name;
  TorchTensor tensor;
};

// The optimizer's tensors of each parameter (in the order given) and this backend's
// "optimizer" metadata section (checkpoint.hpp's: step, betas, eps, weight decay, the fp16
// loss scaler).
struct MegatronOptimizerState {
  std::vector<TorchTensor> main_weights;  // the fp32 copies; empty for an fp32 run
  std::vector<TorchTensor> exp_avg, exp_avg_sq;
  nlohmann::json metadata;
};

// What a rank file's 'optimizer' gives: the state, or why it is not read (`not_read`, a
// sentence: the file was saved without it, or by a distributed or chained optimizer).
struct MegatronOptimizerRead {
  std::optional<MegatronOptimizerState> state;
  std::string not_read;
};
MegatronOptimizerRead read_megatron_optimizer(const MegatronRankFile& file,
                                              std::span<const MegatronParameter> parameters,
                                              const MegatronArguments& args);

// This backend's "opt_param_scheduler" metadata section (checkpoint.cpp's schedule_json) of the
// file's 'opt_param_scheduler'; nullopt when it has none. A missing key or a value of another
// type is a common::Error naming the file.
std::optional<nlohmann::json> read_megatron_scheduler(const MegatronRankFile& file,
                                                      const MegatronArguments& args);

}  // namespace backend
