// checkpoint_util's command line (backend/tools/checkpoint_util.cpp), parsed and validated with
// no side effects (nothing read beyond argv, nothing written), so that it can be fuzzed:
//   --load DIR --export-hf DIR        a checkpoint → a Hugging Face directory
//   --import-hf DIR --save DIR        a Hugging Face directory → a release checkpoint
//       [--replace-training-tracker]  even when DIR's tracker names a training iteration
//   --load DIR --save DIR --target-tensor-parallel-size N
//       [--target-pipeline-parallel-size P] [--make-vocab-size-divisible-by D]
//                                     a checkpoint → the same checkpoint at another
//                                     tensor- and pipeline-parallel size (Megatron's
//                                     convert.py flags)
// Misuse is a common::Error naming the flag ("--load requires --export-hf ...", "nothing to
// do"); sizes below 1 are refused here, a pipeline size that does not divide the checkpoint's
// --num-layers when the checkpoint is read (checkpoint_reshard.hpp).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace backend {

struct CheckpointUtilOptions {
  std::string load, export_hf, import_hf, save;
  bool replace_training_tracker = false;
  // Resharding: the target tensor-parallel size (0: not resharding), the target pipeline size,
  // and the target's --make-vocab-size-divisible-by (0: the checkpoint's).
  int64_t target_tensor_parallel_size = 0;
  int64_t target_pipeline_parallel_size = 1;
  int64_t make_vocab_size_divisible_by = 0;

  bool resharding() const { return target_tensor_parallel_size > 0; }
};

// nullopt after --help (printed to stdout).
std::optional<CheckpointUtilOptions> parse_checkpoint_util_arguments(int argc, const char* const* argv);

}  // namespace backend
