// Resharding a checkpoint to another tensor- and pipeline-parallel size, for checkpoint_util
// --target-tensor-parallel-size T --target-pipeline-parallel-size P (Megatron-LM's
// tools/checkpoint/convert.py with loader_megatron.py and saver_megatron.py, whose flags it
// takes). The checkpoint DIR's tracker names is read from every one of its files, one per
// (tensor-parallel rank, pipeline stage): mp_rank_XX, or mp_rank_XX_YYY when it was saved with
// more than one stage (its metadata's "pipeline_parallel" and its arguments'
// pipeline_model_parallel_size and num_layers_per_virtual_pipeline_stage say which stage holds
// which layers). Every tensor (the parameters and, where the checkpoint has them, AdamW's two
// moments) is assembled whole by its global name, each file's shards put in place by the source
// layout (ParameterLayout(config, tp, rank, stage) and shard_pieces); the last stage's copy of a
// tied word embedding (tied_copy) is left out, the first stage holding the original. The whole
// tensors are then cut into the target's files: each (rank, stage) gets the tensors of its
// layout at the target sizes, the last stage's tied copy made again from the word embedding
// (moments included), as the trainer keeps it. The rest of the state (iteration, consumed
// samples, optimizer step, loss scaler, scheduler, dropout RNG) is carried over unchanged, so
// pretrain_gpt --tensor-model-parallel-size T --pipeline-model-parallel-size P --load OUT
// resumes the run. Megatron's converter saves weights only (--no-save-optim, --no-save-rng);
// this one keeps the whole state.
//
// The source may also be a Megatron-LM checkpoint (--ckpt-format torch, megatron_checkpoint.hpp:
// its mp_rank_*/model_optim_rng.pt files, told apart by the files its tracker's iteration
// holds), read through the same ShardFile interface (shard_file.hpp): its weights, iteration,
// consumed samples, AdamW moments and scheduler are converted (megatron_optimizer.hpp), its
// RNG state is not (Megatron's generators have no counterpart here).
//
// The interleaved schedule's --num-layers-per-virtual-pipeline-stage is kept when the trainer
// accepts it at P (P > 2 and dividing the layers per stage); otherwise the target has none (0),
// and the progress output says so, since the resumed run must then not pass it.
//
// The padded vocabulary depends on the tensor-parallel size (a multiple of
// --make-vocab-size-divisible-by × tp). The target's is computed as Megatron's saver computes
// it: the tokenizer's size (its true_vocab_size) padded with the checkpoint's divisor (or
// `make_vocab_size_divisible_by` when given) × T. The rows of the word embedding and of
// output_layer (and their moments) are then cut to it, or padded to it with copies of the last
// source row, as Megatron's saver pads (pad_weight: "replicating final entry"); the moments of
// the added rows are copies too, so each added row is a clone of that row in every state. A
// cut that would drop a row below the tokenizer's size is refused.
//
// The layout comes from the checkpoint's record of its arguments (checkpoint_record.hpp); the
// files are written by write_checkpoint_files (checkpoint.hpp: crash-safe, as the trainer saves),
// in this backend's format or, with ReshardOptions::megatron (checkpoint_util's convert.py
// spelling, --saver), in Megatron-LM's (megatron_checkpoint_writer.hpp).
#pragma once

#include <cstdint>
#include <filesystem>
#include <iosfwd>
#include <string>
#include <vector>

#include "backend/ckpt/checkpoint.hpp"
#include "backend/ckpt/checkpoint_record.hpp"
#include "backend/model/gpt_model.hpp"

namespace backend {

struct ReshardOptions {
  std::filesystem::path load;  // the checkpoint directory (its tracker names what is resharded)
  std::filesystem::path save;  // the new checkpoint directory: not `load`, and without a tracker
  int64_t target_tensor_parallel = 1;
  int64_t target_pipeline_parallel = 1;
  int64_t make_vocab_size_divisible_by = 0;  // the target's; 0: the checkpoint's
  std::vector<std::string> command_line{};   // recorded in the metadata ("resharded")
  // Write the target in Megatron-LM's format (checkpoint.hpp's MegatronFileFormat), not ours.
  const MegatronFileFormat* megatron = nullptr;
};

struct ReshardResult {
  int64_t iteration = 0;
  bool release = false;
  int64_t source_tensor_parallel = 1;
  int64_t source_pipeline_parallel = 1;
  // The source's --num-layers-per-virtual-pipeline-stage (0: none), and whether the target
  // goes without it because it does not fit the target's pipeline size.
  int64_t source_layers_per_virtual_stage = 0;
  bool interleaving_dropped = false;
  int64_t source_padded_vocab_size = 0;
  int64_t target_padded_vocab_size = 0;
  // The target --make-vocab-size-divisible-by that would have kept the source's padded
  // vocabulary (divisor_keeping_padding), 0 when none does.
  int64_t divisor_keeping_padding = 0;
  bool optimizer_state = false;  // the moments were carried (the source had them)
  std::string optimizer_not_read;  // else why, when the source is one not read (Megatron's)
  bool rng_state = false;        // the source had the dropout RNG's state
  // The model's arguments as the target records them: its tp, pp, interleaving and divisor.
  CheckpointModelRecord target_arguments;
};

// Reshards the checkpoint options.load's tracker names into options.save (holding its save
// lock while it writes): an iteration becomes the same iteration there, a release a release.
// Progress lines go to `out`. Everything is checked before anything is written, each failure a
// common::Error naming the flag or file: no tracker, a missing or inconsistent file of a
// (tensor-parallel rank, stage), a tensor that does not fit the checkpoint's own arguments, a
// target tensor-parallel size that does not divide the heads, query groups, --ffn-hidden-size
// or the padded vocabulary (check_tensor_parallel's messages), a target pipeline size below 1
// or not dividing --num-layers, --save being --load or holding a checkpoint already, a model too
// big for this machine's memory (common::require_memory_fits).
ReshardResult reshard_checkpoint(const ReshardOptions& options, std::ostream& out);

// The weights of the checkpoint DIR's tracker names, assembled whole from the files of however
// many tensor-parallel ranks and pipeline stages saved it (the tied copy left out), in the
// one-process model of its arguments, with the padded vocabulary its files hold (the saving
// size's); the optimizer state is not read. For checkpoint_util --export-hf
// (checkpoint_conversion.hpp's load_checkpoint_weights) of a model-parallel run. Refused as
// reshard_checkpoint refuses a bad source, and when the weights, twice (model and files),
// exceed this machine's memory.
GptModel<float> load_whole_checkpoint_weights(const std::filesystem::path& directory,
                                              std::ostream& out);

// The --make-vocab-size-divisible-by under which `tensor_parallel` ranks pad `vocab_size`
// tokens to exactly `padded_vocab_size` rows: `divisor` × `from_tensor_parallel` /
// `tensor_parallel` when that is a whole number that does, else padded / tensor_parallel when
// that does, else 0 (none does). checkpoint_util suggests it to keep a checkpoint's padding.
int64_t divisor_keeping_padding(int64_t vocab_size, int64_t padded_vocab_size, int64_t divisor,
                                int64_t from_tensor_parallel, int64_t tensor_parallel);

}  // namespace backend
