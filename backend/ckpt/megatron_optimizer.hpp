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
//   DistributedOptimizer          {'optimizer': {'param_groups': [...]}} without 'state' or
//                                 the groups' 'params' (and 'grad_scaler' under fp16): the
//                                 fp32 parameters and the moments are in distrib_optim.pt
//                                 beside the file (below)
//   ChainedOptimizer of several   a list of the above: not read yet
// Torch numbers the parameters across the groups in order. Megatron's groups
// (megatron/core/optimizer/__init__.py: _get_param_groups) hold the model's parameters in the
// order of named_parameters(), which is the model state dict's order, split by weight decay: the
// biases and 1-D parameters in a group with wd_mult 0 (before wd_mult: weight_decay 0), the rest
// in another; which group comes first has changed between versions, so each group is matched
// by its wd_mult. A group whose parameter count is not its class's (another split: --decoupled-lr,
// per-parameter overrides) is refused, and so is a moment whose shape is not its parameter's.
//
// distrib_optim.pt is DistributedOptimizer.save_parameter_state's (distrib_optimizer.py:
// get_parameter_state_dp_zero, the format since February 2024): {'buckets_coalesced': True,
// k: {DTYPES: {'param', 'exp_avg', 'exp_avg_sq': 1-D fp32 tensors, 'numel_unpadded': n}}} for
// each model chunk k's grad buffer (DTYPES: the buffer's (param dtype, grad dtype), or one dtype
// in older files). Each tensor is the buffer's buckets one after the other, their end padding
// left out; the buffer (DistributedOptimizer._compute_per_buffer_param_layout) holds the
// chunk's parameters in reverse named_parameters() order, each one's start aligned to 64
// elements (not aligned before mid-2024: the layout whose size is numel_unpadded is taken), a
// bucket closed once it holds --ddp-bucket-size elements (on the first stage's first chunk under
// --overlap-grad-reduce alone; 40M by default, or the parameters over --ddp-num-buckets) and
// around the tied embedding's copy on a stage of a pipeline (shared_embedding). The older
// per-bucket format is refused with Megatron's command that updates it.
//
// 'opt_param_scheduler' is OptimizerParamScheduler.state_dict(), in samples: max_lr,
// lr_warmup_steps, num_steps, lr_decay_style, lr_decay_steps, min_lr, start_wd, end_wd,
// wd_incr_style, wd_incr_steps (and the older keys its load_state_dict still reads: start_lr,
// warmup_iter, warmup_steps, end_iter, decay_steps, decay_style). The warmup's initial rate
// and the WSD anneal are not in it; they come from the args, as Megatron's scheduler takes them.
#pragma once

#include <cstdint>
#include <memory>
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
  std::string name;  // this backend's
  TorchTensor tensor;
  size_t chunk = 0;  // the model chunk holding it ('model' or 'model<chunk>')
};

// The optimizer's tensors of each parameter (in the order given) and this backend's
// "optimizer" metadata section (checkpoint.hpp's: step, betas, eps, weight decay, the fp16
// loss scaler).
// The tensors are the rank file's, or with the distributed optimizer parameter_state's.
struct MegatronOptimizerState {
  std::vector<TorchTensor> main_weights;  // the fp32 copies; empty for an fp32 run
  std::vector<TorchTensor> exp_avg, exp_avg_sq;
  nlohmann::json metadata;
  std::shared_ptr<const TorchCheckpointFile> parameter_state;  // distrib_optim.pt, open
};

// What a rank file's 'optimizer' gives: the state, or why it is not read (`not_read`, a
// sentence: the file was saved without it, or by a chained optimizer).
struct MegatronOptimizerRead {
  std::optional<MegatronOptimizerState> state;
  std::string not_read;
};
MegatronOptimizerRead read_megatron_optimizer(const MegatronRankFile& file,
                                              std::span<const MegatronParameter> parameters,
                                              const MegatronArguments& args);

// What of a Megatron run's args decides its grad buffers' layout (distributed_data_parallel.py,
// training.py's get_model): the buckets of the first stage's first chunk (under
// --overlap-grad-reduce, of --ddp-bucket-size elements, or the stage's parameters over
// --ddp-num-buckets, or max(40M, 1M × dp × cp)), and whether the tied embedding's copies are on
// two stages of a pipeline (then buckets of their own).
struct MegatronBucketing {
  bool overlap_grad_reduce = false;
  bool overlap_param_gather_with_optimizer_step = false;  // no buckets
  int64_t ddp_bucket_size = 0;                            // 0: None, Megatron's default
  int64_t ddp_num_buckets = 0;                            // 0: None
  int64_t data_parallel_size = 1;                         // × the context-parallel size
  bool tied_across_stages = false;
};
MegatronBucketing megatron_bucketing(const MegatronArguments& args);

// A parameter of a stage as its grad buffer holds it: this backend's name (the tied embedding's
// copies are embedding.word_embeddings.weight and output_layer.weight), its elements, its chunk.
struct MegatronBufferParameter {
  std::string_view name;
  int64_t numel = 0;
  size_t chunk = 0;
};

// The stage's grad buffers, one per model chunk, of its parameters given in named_parameters()
// order: each one's offset in its chunk's distrib_optim.pt tensors, and each chunk's
// numel_unpadded. `alignment`: of each parameter's start, 64 today, 1 before mid-2024.
struct MegatronGradBuffers {
  std::vector<int64_t> offsets;  // per parameter
  std::vector<int64_t> numel;    // per chunk
};
MegatronGradBuffers megatron_grad_buffers(std::span<const MegatronBufferParameter> parameters,
                                          const MegatronBucketing& bucketing,
                                          int64_t alignment = 64);

// This backend's "optimizer" metadata section (step, Adam's constants from the args, the fp16
// loss scaler) of a torch_dist checkpoint's common.pt, whose 'optimizer' keeps what is not
// sharded: torch's param groups and a 'state' holding the step as 'common_step' (Megatron core
// since 2025) or per parameter, or the groups' step (TE's and apex's FusedAdam). Older files
// dropped the step with the sharded moments; `fallback_step` is taken then (the iteration).
nlohmann::json megatron_common_optimizer_metadata(const MegatronRankFile& common,
                                                  const MegatronArguments& args,
                                                  int64_t fallback_step);

// This backend's "opt_param_scheduler" metadata section (checkpoint.cpp's schedule_json) of the
// file's 'opt_param_scheduler'; nullopt when it has none. A missing key or a value of another
// type is a common::Error naming the file.
std::optional<nlohmann::json> read_megatron_scheduler(const MegatronRankFile& file,
                                                      const MegatronArguments& args);

}  // namespace backend
