// Megatron-LM's legacy checkpoint files written (--ckpt-format torch; megatron/training/
// checkpointing.py: generate_state_dict), the inverse of megatron_checkpoint.hpp: one
// model_optim_rng.pt per (tensor-parallel rank, pipeline stage), torch.save's zip format
// (torch_checkpoint_writer.hpp), holding a dict of
//   'args'                the run's arguments as an argparse.Namespace, by Megatron's names
//   'checkpoint_version'  3.0
//   'iteration'
//   'model'               (or 'model0', 'model1', ...: the interleaved schedule's chunks) the
//                         stage's tensors by Megatron core's names, the layers of each chunk
//                         counted from 0, in the order nn.Module.state_dict gives them: a
//                         module's own parameters, its '_extra_state' (None, as
//                         ColumnParallelLinear's get_extra_state returns and Transformer
//                         Engine's set_extra_state takes), then its children in the order
//                         their __init__ makes them (core_attention, linear_proj, linear_qkv).
//                         The module spec is --transformer-impl's: `local` has the norms as
//                         modules of their own; `transformer_engine` (Megatron's default) fuses
//                         input_layernorm into linear_qkv and pre_mlp_layernorm into
//                         linear_fc1 (layer_norm_weight, layer_norm_bias). 16-bit under --bf16
//                         or --fp16, as Megatron's Float16Module holds them.
//   'optimizer'           unless --no-save-optim: FP32Optimizer's state dict (an fp32 run), or
//                         Float16OptimizerWithFloat16Params' {'optimizer', 'grad_scaler' (fp16),
//                         'fp32_from_fp16_params'}, over Transformer Engine's FusedAdam (which
//                         Megatron uses where TE is installed; apex's has the same state): two
//                         param groups as megatron/core/optimizer's _get_param_groups makes
//                         them, the parameters with weight decay first (wd_mult 1), then the
//                         biases and 1-D ones (wd_mult 0), each group with its step, lr and
//                         weight decay; exp_avg and exp_avg_sq per parameter, numbered across
//                         the groups in order
//                         With the distributed optimizer, DistributedOptimizer.state_dict():
//                         {'optimizer': {'param_groups': the same groups without 'params'}}
//                         (and 'grad_scaler'), the parameters' state going to
//                         distrib_optim.pt beside the file, as save_parameter_state writes it
//                         on data-parallel rank 0 (megatron_optimizer.hpp says its layout): per
//                         model chunk, the fp32 parameters and both moments in the grad
//                         buffer's order under the key (param dtype, grad dtype)
//   'opt_param_scheduler' OptimizerParamScheduler.state_dict(), in samples
// and no 'rng_state': Megatron's generators (Python's, NumPy's, torch's, the CUDA tracker's)
// are not this backend's, whose dropout masks come from --seed and a step; Megatron loads these
// files with --no-load-rng (or --finetune), as it loads its own converter's. This backend's
// dropout position is kept under 'native_dropout_state' ({'seed', 'step'}), which Megatron does
// not read, so that a run here resumes from its own --ckpt-format torch save bit for bit.
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "backend/ckpt/checkpoint_file.hpp"
#include "backend/ckpt/checkpointing_arguments.hpp"
#include "backend/model/gpt_config.hpp"
#include "backend/model/pipeline_stage.hpp"

namespace backend {

// What one rank's file holds, in this backend's terms: the metadata and the tensors of the
// file this backend's own format would write (checkpoint.cpp's save: "iteration",
// "consumed_*_samples", "padded_vocab_size", "optimizer", "opt_param_scheduler", "rng_state";
// the parameters by this backend's names, then, with the optimizer's state, their moments as
// optimizer.exp_avg.NAME and optimizer.exp_avg_sq.NAME), and what Megatron's file has besides.
struct MegatronRankFileContents {
  const nlohmann::json* metadata = nullptr;
  std::span<const CheckpointTensor> tensors;
  // The arguments by Megatron's names with Python's types (null for None, lists of strings),
  // in the order the Namespace gets them; consumed_train_samples, consumed_valid_samples and
  // padded_vocab_size are taken from the metadata.
  nlohmann::json args = nlohmann::json::object();
  std::vector<LayerRange> chunks;  // the stage's model chunks
  bool first_stage = true;
  bool last_stage = true;
  MixedPrecision precision = MixedPrecision::none;  // --bf16 / --fp16: the Megatron run's
  MegatronModuleSpec spec = MegatronModuleSpec::transformer_engine;
  // The learning rate and weight decay the scheduler gives now: the param groups' lr and
  // weight_decay (times the group's wd_mult), as Megatron's scheduler sets them each step.
  double learning_rate = 0;
  double weight_decay = 0;
  // --use-distributed-optimizer (or ZeRO-3): the moments (whole, in `tensors`) go to
  // distrib_optim.pt, laid out as the args' bucketing makes Megatron's grad buffers.
  bool distributed_optimizer = false;
};

// Megatron's name, after "decoder.layers.N.", of this backend's layer tensor `native` (after
// "decoder.layers.N.": "input_layernorm.weight", ...) in `spec`'s TransformerLayer.
std::string megatron_layer_tensor_name(std::string_view native, MegatronModuleSpec spec);

// torch_dist's common.pt (megatron_dist_checkpoint.hpp) of `contents` (a new file, fsynced):
// the rank file's dict without the model, its optimizer's param groups without 'params' and
// its 'state' holding only Megatron core's 'common_step' (the parameters' state is sharded).
void write_megatron_common_file(const std::filesystem::path& file,
                                const MegatronRankFileContents& contents);

// Writes `file` (a new file, fsynced), and with the distributed optimizer's state,
// distrib_optim.pt beside it. A tensor of the metadata's model missing from
// `tensors`, or a name neither spec has, is an internal error: both come from the same model.
void write_megatron_rank_file(const std::filesystem::path& file,
                              const MegatronRankFileContents& contents);

}  // namespace backend
