// pretrain_gpt's arguments as checkpoints record them, and the arguments given to backend/ckpt:
// the typed record in a checkpoint's metadata ("arguments": the model's part from
// ckpt/checkpoint_record.hpp, with the run's batches and the optimizer) and its inverse; the
// save and load options the flags give (--save, --no-save-optim, --finetune,
// --use-checkpoint-opt_param-scheduler, ...); --use-checkpoint-args; and save_checkpoint /
// load_checkpoint over TrainingArguments, as the trainer calls them.
// Reference: megatron/training/checkpointing.py (the args saved into model_optim_rng.pt,
// check_checkpoint_args and load_args_from_checkpoint).
#pragma once

#include <filesystem>
#include <functional>
#include <iosfwd>
#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>

#include "backend/ckpt/checkpoint.hpp"
#include "backend/ckpt/checkpoint_record.hpp"
#include "backend/model/gpt_model.hpp"
#include "backend/optim/adamw.hpp"
#include "backend/optim/lr_scheduler.hpp"
#include "backend/train/arguments.hpp"

namespace backend {

// The model's flags of the arguments, as a checkpoint records them, and arguments (defaults
// elsewhere) with a record's model flags.
CheckpointModelRecord model_record(const TrainingArguments& arguments);
TrainingArguments arguments_with_model(const CheckpointModelRecord& record);

// The typed record: num_layers, hidden_size, ..., by Megatron's names (disable_bias_linear
// for --disable-bias-linear; num_query_groups 0 without --group-query-attention).
nlohmann::json checkpoint_arguments(const TrainingArguments& arguments);

// The arguments a checkpoint was saved with, from its metadata's typed record ("arguments"),
// the inverse of checkpoint_arguments. Fields the record does not hold keep their defaults; a
// missing or mistyped field is a common::Error naming `file`.
TrainingArguments arguments_from_checkpoint(const nlohmann::json& metadata,
                                            const std::filesystem::path& file);
// The arguments the checkpoint DIR's tracker names was saved with (require_checkpoint, whose
// errors begin with `option` and end with `remedy`, then arguments_from_checkpoint of that
// file); of a Megatron-LM checkpoint, the model, tokenizer and layout its args give.
TrainingArguments read_saved_arguments(
    const std::filesystem::path& directory, std::string_view option,
    std::string_view remedy = "is it the --save directory of a training run?");

// Megatron's --use-checkpoint-args (megatron/training/checkpointing.py,
// load_args_from_checkpoint): the model's shape from the typed record of the checkpoint --load
// names. As Megatron: num_layers, hidden_size, ffn_hidden_size, seq_length,
// num_attention_heads and max_position_embeddings only where the flag was not given
// (`given(flag)` says); the attention layout, position embedding, normalization, biases,
// SwiGLU, untied output, the dropouts (evaluate_gpt and the server only: pretrain_gpt's follow
// its flags, as Megatron's) and the tokenizer type and model (Megatron's default
// --use-tokenizer-model-from-checkpoint-args) whatever the flags say. Beyond Megatron's list,
// because the model computed depends on them: make_vocab_size_divisible_by, vocab_size
// (NullTokenizer) and norm_epsilon, where not given. Each value taken is printed to `out` as
// Megatron prints it ("Setting num_layers to 24 from checkpoint"). A missing checkpoint or
// record is a common::Error naming --load.
void take_checkpoint_model_arguments(TrainingArguments& arguments,
                                     const std::function<bool(std::string_view flag)>& given,
                                     std::ostream& out);

// --save and its flags, the typed record, the full dump (argument_values) and the command line.
CheckpointSaveOptions checkpoint_save_options(const TrainingArguments& arguments);
// --load and its flags, the typed record of the current arguments and the command line.
CheckpointLoadOptions checkpoint_load_options(const TrainingArguments& arguments);
// What --rollback-on-spike reloads: the run's own checkpoint in --save, whole (weights,
// optimizer and scheduler, and the dropout RNG where --no-save-rng did not leave it out).
CheckpointLoadOptions rollback_load_options(const TrainingArguments& arguments);

// backend/ckpt's save_checkpoint, save_release_checkpoint and load_checkpoint with the
// options the arguments give (checkpoint.hpp says what each does).
void save_checkpoint(const TrainingArguments& arguments, const TrainingProgress& progress,
                     const GptModel<float>& model, const AdamW& optimizer,
                     const LearningRateScheduler& scheduler, std::ostream& out,
                     const OptimizerShard* shard = nullptr);
void save_release_checkpoint(const TrainingArguments& arguments, const GptModel<float>& model,
                             std::ostream& out);
std::optional<TrainingProgress> load_checkpoint(const TrainingArguments& arguments,
                                                GptModel<float>& model, AdamW& optimizer,
                                                LearningRateScheduler& scheduler, std::ostream& out,
                                                const ShardRange* optimizer_range = nullptr);

}  // namespace backend
