// checkpoint_util's command line (backend/tools/checkpoint_util.cpp), parsed and validated with
// no side effects (nothing read beyond argv, nothing written), so that it can be fuzzed:
//   --load DIR --export-hf DIR        a checkpoint → a Hugging Face directory
//   --import-hf DIR --save DIR        a Hugging Face directory → a release checkpoint
//       [--replace-training-tracker]  even when DIR's tracker names a training iteration
//   --load DIR --export-nemo FILE     a checkpoint → a NeMo .nemo archive
//       [--vocab-file F --merge-file F]  GPT-2 BPE's files, packed in
//   --import-nemo FILE --save DIR     a .nemo → a release checkpoint
//       [--replace-training-tracker]
//   --load DIR --save DIR --target-tensor-parallel-size N
//       [--target-pipeline-parallel-size P] [--make-vocab-size-divisible-by D]
//                                     a checkpoint → the same checkpoint at another
//                                     tensor- and pipeline-parallel size (Megatron's
//                                     convert.py flags)
//   --model-type GPT --loader L --saver S --load-dir DIR --save-dir DIR
//       [--target-tensor-parallel-size N] [--target-pipeline-parallel-size P]
//       [--saver-transformer-impl transformer_engine|local] [--make-vocab-size-divisible-by D]
//                                     Megatron's own spelling of the same: the checkpoint (ours
//                                     or Megatron's; L is megatron, mcore, core or legacy) →
//                                     Megatron-LM's format (S is megatron, mcore or core), at
//                                     the checkpoint's sizes where no target is given
// Misuse is a common::Error naming the flag ("--load requires --export-hf ...", "nothing to
// do"); sizes below 1 are refused here, a pipeline size that does not divide the checkpoint's
// --num-layers when the checkpoint is read (checkpoint_reshard.hpp).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "backend/ckpt/checkpointing_arguments.hpp"

namespace backend {

struct CheckpointUtilOptions {
  std::string load, export_hf, import_hf, export_nemo, import_nemo, save;
  std::string vocab_file, merge_file;  // --export-nemo: GPT-2 BPE's files to pack
  bool replace_training_tracker = false;
  // Resharding: the target tensor-parallel size (0: not resharding), the target pipeline size,
  // and the target's --make-vocab-size-divisible-by (0: the checkpoint's).
  int64_t target_tensor_parallel_size = 0;
  int64_t target_pipeline_parallel_size = 1;  // 0 with the converter's spelling: the checkpoint's
  int64_t make_vocab_size_divisible_by = 0;
  // Megatron's converter spelling: the target is written in Megatron-LM's format, its tensors
  // named for --saver-transformer-impl; a target size of 0 is the checkpoint's own.
  bool megatron_converter = false;
  MegatronModuleSpec saver_transformer_impl = MegatronModuleSpec::transformer_engine;

  bool resharding() const { return target_tensor_parallel_size > 0 || megatron_converter; }
  bool importing() const { return !import_hf.empty() || !import_nemo.empty(); }
};

// nullopt after --help (printed to stdout).
std::optional<CheckpointUtilOptions> parse_checkpoint_util_arguments(int argc, const char* const* argv);

}  // namespace backend
