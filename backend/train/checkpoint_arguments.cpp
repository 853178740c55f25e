// The arguments ↔ checkpoint records and options; see checkpoint_arguments.hpp.
#include "backend/train/checkpoint_arguments.hpp"

#include <fmt/format.h>

#include <ostream>
#include <span>
#include <string>
#include <type_traits>
#include <variant>

#include "backend/ckpt/checkpoint_file.hpp"
#include "backend/common/error.hpp"
#include "backend/train/flag_table.hpp"

using nlohmann::json;

namespace backend {

namespace {

// The arguments a checkpoint records (its metadata's "arguments"), by Megatron's names: one table
// per concern that both the record and its reading walk, so a field cannot be written and not
// read back. An enum is recorded as its name (gpt_config.hpp's spellings). Two records are not
// a field as it is, and follow the tables in both directions: disable_bias_linear
// (!add_bias_linear) and num_query_groups (0 for multi-head attention). A key that decides a
// tensor shape also needs its row in kShapeFlags (backend/ckpt/checkpoint.cpp), which names the
// flag when a checkpoint does not fit.
template <typename Config>
using RecordedField = std::variant<int64_t Config::*, uint64_t Config::*, double Config::*,
                                   bool Config::*, std::string Config::*, EnumFlagField<Config>>;
template <typename Config>
struct RecordedArgument {
  const char* key;
  RecordedField<Config> field;
  bool optional = false;  // absent from checkpoints made before the flag existed
};
constexpr bool kOptional = true;
const RecordedArgument<ModelArguments> kRecordedModelArguments[] = {
    {"num_layers", &ModelArguments::num_layers},
    {"hidden_size", &ModelArguments::hidden_size},
    {"ffn_hidden_size", &ModelArguments::ffn_hidden_size},
    {"num_attention_heads", &ModelArguments::num_attention_heads},
    {"seq_length", &ModelArguments::seq_length},
    {"max_position_embeddings", &ModelArguments::max_position_embeddings},
    {"make_vocab_size_divisible_by", &ModelArguments::make_vocab_size_divisible_by},
    {"init_method_std", &ModelArguments::init_method_std},
    {"norm_epsilon", &ModelArguments::norm_epsilon},
    {"position_embedding_type", enum_flag_field<&ModelArguments::position_embedding_type>()},
    {"rotary_base", &ModelArguments::rotary_base},
    {"rotary_percent", &ModelArguments::rotary_percent},
    {"use_rope_scaling", &ModelArguments::use_rope_scaling, kOptional},
    {"rope_scaling_factor", &ModelArguments::rope_scaling_factor, kOptional},
    {"normalization", enum_flag_field<&ModelArguments::normalization>()},
    {"apply_layernorm_1p", &ModelArguments::apply_layernorm_1p, kOptional},
    {"swiglu", &ModelArguments::swiglu},
    {"untie_embeddings_and_output_weights", &ModelArguments::untie_embeddings_and_output_weights},
    {"hidden_dropout", &ModelArguments::hidden_dropout},
    {"attention_dropout", &ModelArguments::attention_dropout},
};
const RecordedArgument<TokenizerOptions> kRecordedTokenizerArguments[] = {
    {"tokenizer_type", &TokenizerOptions::tokenizer_type},
    {"tokenizer_model", &TokenizerOptions::tokenizer_model, kOptional},
    {"vocab_size", &TokenizerOptions::vocab_size},
};
const RecordedArgument<ParallelismArguments> kRecordedParallelismArguments[] = {
    {"tensor_model_parallel_size", &ParallelismArguments::tensor_model_parallel_size},
    {"pipeline_model_parallel_size", &ParallelismArguments::pipeline_model_parallel_size},
    {"num_layers_per_virtual_pipeline_stage",
     &ParallelismArguments::num_layers_per_virtual_pipeline_stage, kOptional},
};
const RecordedArgument<RunArguments> kRecordedRunArguments[] = {
    {"micro_batch_size", &RunArguments::micro_batch_size},
    {"global_batch_size", &RunArguments::global_batch_size},
    {"train_iters", &RunArguments::train_iters},
    {"seed", &RunArguments::seed},
};
const RecordedArgument<OptimizerArguments> kRecordedOptimizerArguments[] = {
    {"lr", &OptimizerArguments::lr},
    {"min_lr", &OptimizerArguments::min_lr},
    {"lr_decay_style", enum_flag_field<&OptimizerArguments::lr_decay_style>()},
    {"lr_warmup_iters", &OptimizerArguments::lr_warmup_iters},
    {"lr_decay_iters", &OptimizerArguments::lr_decay_iters},
    {"lr_warmup_init", &OptimizerArguments::lr_warmup_init},
    {"weight_decay", &OptimizerArguments::weight_decay},
    {"clip_grad", &OptimizerArguments::clip_grad},
    {"adam_beta1", &OptimizerArguments::adam_beta1},
    {"adam_beta2", &OptimizerArguments::adam_beta2},
    {"adam_eps", &OptimizerArguments::adam_eps},
};

template <typename Config>
void record_arguments(const Config& config, std::span<const RecordedArgument<Config>> table,
                      json& record) {
  for (const RecordedArgument<Config>& argument : table) {
    std::visit(
        [&](auto member) {
          if constexpr (std::is_same_v<decltype(member), EnumFlagField<Config>>) {
            record[argument.key] = std::string(member.name(config));
          } else {
            record[argument.key] = config.*member;
          }
        },
        argument.field);
  }
}

template <typename Config>
void read_recorded_arguments(const CheckpointMetadata& root, const json& saved,
                             const std::filesystem::path& file,
                             std::span<const RecordedArgument<Config>> table, Config& config) {
  for (const RecordedArgument<Config>& argument : table) {
    if (argument.optional && !saved.contains(argument.key)) continue;
    std::visit(
        [&](auto member) {
          if constexpr (std::is_same_v<decltype(member), EnumFlagField<Config>>) {
            const auto name = root.get<std::string>(saved, argument.key);
            if (!member.set(config, name)) {
              common::fail(
                  "checkpoint {}: metadata field '{}' names no setting this backend "
                  "knows ({})",
                  file.string(), argument.key, saved[argument.key].dump());
            }
          } else {
            using Value = std::remove_reference_t<decltype(config.*member)>;
            config.*member = root.get<Value>(saved, argument.key);
          }
        },
        argument.field);
  }
}

}  // namespace

json checkpoint_arguments(const TrainingArguments& a) {
  json record = json::object();
  record_arguments<ModelArguments>(a.model, kRecordedModelArguments, record);
  record_arguments<TokenizerOptions>(a.tokenizer, kRecordedTokenizerArguments, record);
  record_arguments<ParallelismArguments>(a.parallelism, kRecordedParallelismArguments, record);
  record_arguments<OptimizerArguments>(a.optimizer, kRecordedOptimizerArguments, record);
  record_arguments<RunArguments>(a.run, kRecordedRunArguments, record);
  record["disable_bias_linear"] = !a.model.add_bias_linear;
  record["num_query_groups"] = a.model.group_query_attention ? a.model.num_query_groups : 0;
  return record;
}

TrainingArguments arguments_from_checkpoint(const json& metadata, const std::filesystem::path& file) {
  const CheckpointMetadata root(metadata, file);
  const json& saved = root.section("arguments");
  TrainingArguments a;
  read_recorded_arguments<ModelArguments>(root, saved, file, kRecordedModelArguments, a.model);
  read_recorded_arguments<TokenizerOptions>(root, saved, file, kRecordedTokenizerArguments,
                                            a.tokenizer);
  read_recorded_arguments<ParallelismArguments>(root, saved, file, kRecordedParallelismArguments,
                                                a.parallelism);
  read_recorded_arguments<OptimizerArguments>(root, saved, file, kRecordedOptimizerArguments,
                                              a.optimizer);
  read_recorded_arguments<RunArguments>(root, saved, file, kRecordedRunArguments, a.run);
  a.model.add_bias_linear = !root.get<bool>(saved, "disable_bias_linear");
  const auto num_query_groups = root.get<int64_t>(saved, "num_query_groups");
  a.model.group_query_attention = num_query_groups > 0;
  if (a.model.group_query_attention) a.model.num_query_groups = num_query_groups;
  return a;
}

TrainingArguments read_saved_arguments(const std::filesystem::path& directory,
                                       std::string_view option, std::string_view remedy) {
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
          .command_line = a.command_line};
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
