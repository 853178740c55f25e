// The checkpointing flags as one value: Megatron-LM's checkpointing arguments (megatron/
// training/arguments.py: _add_checkpointing_args, and --pretrained-checkpoint from tasks/main.py)
// under its dest names. pretrain_gpt's parser fills it from its checkpoint tables (backend/
// train/arguments.cpp); backend/train/checkpoint_arguments.hpp turns it, with the arguments
// record, into the CheckpointSaveOptions and CheckpointLoadOptions that checkpoint.hpp takes.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "backend/common/enum_names.hpp"

namespace backend {

// --ckpt-format: this backend's own files (model_optim_rng.bin, checkpoint_file.hpp), the
// default, or Megatron-LM's legacy ones (model_optim_rng.pt, megatron_checkpoint_writer.hpp).
// Megatron core's distributed formats are named so that they are refused as not built.
enum class CheckpointFormat { native, torch, torch_dist, zarr, torch_dcp };
constexpr common::EnumName<CheckpointFormat> kCheckpointFormatNames[] = {
    {CheckpointFormat::native, "native"},
    {CheckpointFormat::torch, "torch"},
    {CheckpointFormat::torch_dist, "torch_dist"},
    {CheckpointFormat::zarr, "zarr"},
    {CheckpointFormat::torch_dcp, "torch_dcp"}};
constexpr std::span<const common::EnumName<CheckpointFormat>> enum_names(CheckpointFormat) {
  return kCheckpointFormatNames;
}

// --transformer-impl: Megatron core's module spec, which computes the same model either way;
// here it names the tensors of a --ckpt-format torch save (megatron_checkpoint_writer.hpp).
enum class MegatronModuleSpec { transformer_engine, local };
constexpr common::EnumName<MegatronModuleSpec> kMegatronModuleSpecNames[] = {
    {MegatronModuleSpec::transformer_engine, "transformer_engine"},
    {MegatronModuleSpec::local, "local"}};
constexpr std::span<const common::EnumName<MegatronModuleSpec>> enum_names(MegatronModuleSpec) {
  return kMegatronModuleSpecNames;
}

struct CheckpointingArguments {
  std::string save;  // --save: the directory checkpoints are written to
  std::string load;  // --load: the directory a run resumes from
  // Megatron's --pretrained-checkpoint (tasks/finetune_utils.py): when --load holds no
  // checkpoint, start from this one's weights as --finetune would.
  std::string pretrained_checkpoint;
  int64_t save_interval = 0;  // 0: save only at --exit-interval and at the end
  // --load naming a directory without a checkpoint is an error, not a start from scratch.
  bool exit_on_missing_checkpoint = false;
  bool finetune = false;  // load the weights only; iteration and samples start at 0
  bool no_load_optim = false;
  bool no_load_rng = false;
  bool no_save_optim = false;
  bool no_save_rng = false;
  bool override_opt_param_scheduler = false;        // schedule from the flags, not the checkpoint
  bool use_checkpoint_opt_param_scheduler = false;  // schedule from the checkpoint, not the flags
  // --use-checkpoint-args: the model's shape and tokenizer from the --load checkpoint
  // (take_checkpoint_model_arguments in backend/train/checkpoint_arguments.hpp).
  bool use_checkpoint_args = false;
  CheckpointFormat ckpt_format = CheckpointFormat::native;
  MegatronModuleSpec transformer_impl = MegatronModuleSpec::transformer_engine;
};

}  // namespace backend
