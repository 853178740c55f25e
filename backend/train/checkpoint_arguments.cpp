// The arguments ↔ checkpoint records and options; see checkpoint_arguments.hpp.
#include "backend/train/checkpoint_arguments.hpp"

#include <fmt/format.h>

#include <ostream>
#include <string>
#include <type_traits>

#include "backend/ckpt/checkpoint_file.hpp"
#include "backend/ckpt/megatron_checkpoint.hpp"
#include "backend/common/error.hpp"

using nlohmann::json;

namespace backend {

namespace {

// The trainer's own concerns in a checkpoint's record, in tables of the kind of the model's
// (ckpt/checkpoint_record.hpp).
const RecordedArgument<RunArguments> kRecordedRunArguments[] = {
    {"micro_batch_size", &RunArguments::micro_batch_size},
    {"global_batch_size", &RunArguments::global_batch_size},
    {"train_iters", &RunArguments::train_iters},
    {"seed", &RunArguments::seed},
};
const RecordedArgument<OptimizerArguments> kRecordedOptimizerArguments[] = {
    {"lr", &OptimizerArguments::lr},
    {"min_lr", &OptimizerArguments::min_lr},
    {"lr_decay_style", common::enum_flag_field<&OptimizerArguments::lr_decay_style>()},
    {"lr_warmup_iters", &OptimizerArguments::lr_warmup_iters},
    {"lr_decay_iters", &OptimizerArguments::lr_decay_iters},
    {"lr_warmup_init", &OptimizerArguments::lr_warmup_init},
    {"weight_decay", &OptimizerArguments::weight_decay},
    {"clip_grad", &OptimizerArguments::clip_grad},
    {"adam_beta1", &OptimizerArguments::adam_beta1},
    {"adam_beta2", &OptimizerArguments::adam_beta2},
    {"adam_eps", &OptimizerArguments::adam_eps},
};

}  // namespace

CheckpointModelRecord model_record(const TrainingArguments& arguments) {
  return {.model = arguments.model,
          .tokenizer = arguments.tokenizer,
          .parallelism = arguments.parallelism};
}

TrainingArguments arguments_with_model(const CheckpointModelRecord& record) {
  TrainingArguments arguments;
  arguments.model = record.model;
  arguments.tokenizer = record.tokenizer;
  arguments.parallelism = record.parallelism;
  return arguments;
}

json checkpoint_arguments(const TrainingArguments& a) {
  json record = json::object();
  record_model(model_record(a), record);
  record_arguments<OptimizerArguments>(a.optimizer, kRecordedOptimizerArguments, record);
  record_arguments<RunArguments>(a.run, kRecordedRunArguments, record);
  return record;
}

TrainingArguments arguments_from_checkpoint(const json& metadata, const std::filesystem::path& file) {
  const CheckpointMetadata root(metadata, file);
  TrainingArguments a = arguments_with_model(read_model_record(root, file));
  const json& saved = root.section("arguments");
  read_recorded_arguments<OptimizerArguments>(root, saved, file, kRecordedOptimizerArguments,
                                              a.optimizer);
  read_recorded_arguments<RunArguments>(root, saved, file, kRecordedRunArguments, a.run);
  return a;
}

TrainingArguments read_saved_arguments(const std::filesystem::path& directory,
                                       std::string_view option, std::string_view remedy) {
  if (is_megatron_checkpoint(directory)) {
    // Megatron's args give the model, its tokenizer and its layout (megatron_model_record); the
    // optimizer's and the run's arguments stay this run's.
    const MegatronCheckpointLayout layout = read_megatron_layout(directory);
    return arguments_with_model(
        megatron_model_record(MegatronRankFile(layout.rank_file(0, 0)).arguments()));
  }
  const TrackedCheckpoint tracked = require_checkpoint(directory, option, remedy);
  const CheckpointFileReader reader(tracked.file);
  return arguments_from_checkpoint(reader.metadata(), reader.path());
}

void take_checkpoint_model_arguments(TrainingArguments& arguments,
                                     const std::function<bool(std::string_view flag)>& given,
                                     std::ostream& out) {
  if (arguments.checkpointing.load.empty()) {
    common::fail("--use-checkpoint-args needs --load DIR: the checkpoint whose arguments give the "
                 "model's shape");
  }
  const TrainingArguments saved = read_saved_arguments(
      arguments.checkpointing.load, "--use-checkpoint-args: --load",
      "point --load at pretrain_gpt's --save directory, or give the model flags (--num-layers, "
      "--hidden-size, ...) instead");
  // Megatron prints each argument it takes: "Setting <name> to <value> from checkpoint".
  auto take = [&](std::string_view name, auto& target, const auto& value) {
    target = value;
    using Value = std::decay_t<decltype(value)>;
    std::string shown;
    if constexpr (std::is_same_v<Value, bool>) {
      shown = value ? "True" : "False";
    } else if constexpr (std::is_enum_v<Value>) {
      shown = common::enum_name(value);
    } else {
      shown = fmt::format("{}", value);
    }
    out << fmt::format("Setting {} to {} from checkpoint", name, shown) << std::endl;
  };
  auto unless_given = [&](std::string_view flag, std::string_view name, auto& target, const auto& value) {
    if (!given(flag)) take(name, target, value);
  };
  ModelArguments& model = arguments.model;
  const ModelArguments& recorded = saved.model;
  unless_given("--num-layers", "num_layers", model.num_layers, recorded.num_layers);
  unless_given("--hidden-size", "hidden_size", model.hidden_size, recorded.hidden_size);
  unless_given("--ffn-hidden-size", "ffn_hidden_size", model.ffn_hidden_size,
               recorded.ffn_hidden_size);
  unless_given("--seq-length", "seq_length", model.seq_length, recorded.seq_length);
  unless_given("--num-attention-heads", "num_attention_heads", model.num_attention_heads,
               recorded.num_attention_heads);
  unless_given("--max-position-embeddings", "max_position_embeddings",
               model.max_position_embeddings, recorded.max_position_embeddings);
  unless_given("--make-vocab-size-divisible-by", "make_vocab_size_divisible_by",
               model.make_vocab_size_divisible_by, recorded.make_vocab_size_divisible_by);
  unless_given("--vocab-size", "vocab_size", arguments.tokenizer.vocab_size,
               saved.tokenizer.vocab_size);
  unless_given("--norm-epsilon", "norm_epsilon", model.norm_epsilon, recorded.norm_epsilon);
  take("group_query_attention", model.group_query_attention, recorded.group_query_attention);
  take("num_query_groups", model.num_query_groups, recorded.num_query_groups);
  take("position_embedding_type", model.position_embedding_type, recorded.position_embedding_type);
  take("rotary_base", model.rotary_base, recorded.rotary_base);
  take("rotary_percent", model.rotary_percent, recorded.rotary_percent);
  // Not in Megatron's list, which would serve a Llama 3.x checkpoint with plain RoPE's angles.
  take("use_rope_scaling", model.use_rope_scaling, recorded.use_rope_scaling);
  take("rope_scaling_factor", model.rope_scaling_factor, recorded.rope_scaling_factor);
  take("add_bias_linear", model.add_bias_linear, recorded.add_bias_linear);
  take("swiglu", model.swiglu, recorded.swiglu);
  take("untie_embeddings_and_output_weights", model.untie_embeddings_and_output_weights,
       recorded.untie_embeddings_and_output_weights);
  take("apply_layernorm_1p", model.apply_layernorm_1p, recorded.apply_layernorm_1p);
  take("normalization", model.normalization, recorded.normalization);
  // Evaluation and serving run without dropout, and take the record's for the dump; training
  // follows its flags, as Megatron's list has no dropout.
  if (arguments.program != ArgumentsProgram::pretrain_gpt) {
    take("hidden_dropout", model.hidden_dropout, recorded.hidden_dropout);
    take("attention_dropout", model.attention_dropout, recorded.attention_dropout);
  }
  take("tokenizer_type", arguments.tokenizer.tokenizer_type, saved.tokenizer.tokenizer_type);
  // Megatron forces the checkpoint's path too; a path given here wins (the run that saved it may
  // have read the file elsewhere). None recorded: nothing to take.
  if (!saved.tokenizer.tokenizer_model.empty()) {
    unless_given("--tokenizer-model", "tokenizer_model", arguments.tokenizer.tokenizer_model,
                 saved.tokenizer.tokenizer_model);
  }
}

CheckpointSaveOptions checkpoint_save_options(const TrainingArguments& a) {
  return {.directory = a.checkpointing.save,
          .no_save_optim = a.checkpointing.no_save_optim,
          .no_save_rng = a.checkpointing.no_save_rng,
          .arguments = checkpoint_arguments(a),
          .args = argument_values(a),
          .command_line = a.command_line,
          .format = a.checkpointing.ckpt_format,
          .megatron_spec = a.checkpointing.transformer_impl,
          .megatron_args = a.checkpointing.ckpt_format == CheckpointFormat::torch ||
                                   a.checkpointing.ckpt_format == CheckpointFormat::torch_dist
                               ? megatron_arguments(a)
                               : nlohmann::json::object()};
}

CheckpointLoadOptions checkpoint_load_options(const TrainingArguments& a) {
  return {.directory = a.checkpointing.load,
          .finetune = a.checkpointing.finetune,
          .no_load_optim = a.checkpointing.no_load_optim,
          .no_load_rng = a.checkpointing.no_load_rng,
          .use_checkpoint_opt_param_scheduler = a.checkpointing.use_checkpoint_opt_param_scheduler,
          .override_opt_param_scheduler = a.checkpointing.override_opt_param_scheduler,
          .arguments = checkpoint_arguments(a),
          .command_line = a.command_line,
          .name_config_keys = a.name_config_keys};
}

CheckpointLoadOptions rollback_load_options(const TrainingArguments& arguments) {
  CheckpointLoadOptions options = checkpoint_load_options(arguments);
  options.directory = arguments.checkpointing.save;
  options.finetune = false;
  options.no_load_optim = false;
  options.no_load_rng = arguments.checkpointing.no_save_rng;
  return options;
}

void save_checkpoint(const TrainingArguments& arguments, const TrainingProgress& progress,
                     const GptModel<float>& model, const AdamW& optimizer,
                     const LearningRateScheduler& scheduler, std::ostream& out,
                     const OptimizerShard* shard) {
  save_checkpoint(checkpoint_save_options(arguments), progress, model, optimizer, scheduler, out,
                  shard);
}

void save_release_checkpoint(const TrainingArguments& arguments, const GptModel<float>& model,
                             std::ostream& out) {
  save_release_checkpoint(checkpoint_save_options(arguments), model, out);
}

std::optional<TrainingProgress> load_checkpoint(const TrainingArguments& arguments,
                                                GptModel<float>& model, AdamW& optimizer,
                                                LearningRateScheduler& scheduler, std::ostream& out,
                                                const ShardRange* optimizer_range) {
  return load_checkpoint(checkpoint_load_options(arguments), model, optimizer, scheduler, out,
                         optimizer_range);
}

}  // namespace backend
