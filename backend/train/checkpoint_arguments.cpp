// The arguments ↔ checkpoint records and options; see checkpoint_arguments.hpp.
#include "backend/train/checkpoint_arguments.hpp"

#include <fmt/format.h>

#include <ostream>
#include <string>
#include <type_traits>

#include "backend/ckpt/checkpoint_file.hpp"
#include "backend/common/error.hpp"

using nlohmann::json;

namespace backend {

// A key that decides a tensor shape also needs its row in kShapeFlags
// (backend/ckpt/checkpoint.cpp), which names the flag when a checkpoint does not fit.
json checkpoint_arguments(const TrainingArguments& a) {
  return {
      {"num_layers", a.num_layers},
      {"hidden_size", a.hidden_size},
      {"ffn_hidden_size", a.ffn_hidden_size},
      {"num_attention_heads", a.num_attention_heads},
      {"seq_length", a.seq_length},
      {"max_position_embeddings", a.max_position_embeddings},
      {"make_vocab_size_divisible_by", a.make_vocab_size_divisible_by},
      {"tokenizer_type", a.tokenizer_type},
      {"tokenizer_model", a.tokenizer_model},
      {"vocab_size", a.vocab_size},
      {"tensor_model_parallel_size", a.tensor_model_parallel_size},
      {"pipeline_model_parallel_size", a.pipeline_model_parallel_size},
      {"num_layers_per_virtual_pipeline_stage", a.num_layers_per_virtual_pipeline_stage},
      {"init_method_std", a.init_method_std},
      {"norm_epsilon", a.norm_epsilon},
      {"position_embedding_type", a.position_embedding_type},
      {"rotary_base", a.rotary_base},
      {"rotary_percent", a.rotary_percent},
      {"normalization", a.normalization},
      {"apply_layernorm_1p", a.apply_layernorm_1p},
      {"swiglu", a.swiglu},
      {"disable_bias_linear", !a.add_bias_linear},
      {"untie_embeddings_and_output_weights", a.untie_embeddings_and_output_weights},
      {"num_query_groups", a.group_query_attention ? a.num_query_groups : 0},  // 0: MHA
      {"hidden_dropout", a.hidden_dropout},
      {"attention_dropout", a.attention_dropout},
      {"micro_batch_size", a.micro_batch_size},
      {"global_batch_size", a.global_batch_size},
      {"train_iters", a.train_iters},
      {"seed", a.seed},
      {"lr", a.lr},
      {"min_lr", a.min_lr},
      {"lr_decay_style", a.lr_decay_style},
      {"lr_warmup_iters", a.lr_warmup_iters},
      {"lr_decay_iters", a.lr_decay_iters},
      {"lr_warmup_init", a.lr_warmup_init},
      {"weight_decay", a.weight_decay},
      {"clip_grad", a.clip_grad},
      {"adam_beta1", a.adam_beta1},
      {"adam_beta2", a.adam_beta2},
      {"adam_eps", a.adam_eps},
  };
}

TrainingArguments arguments_from_checkpoint(const json& metadata, const std::filesystem::path& file) {
  const CheckpointMetadata root(metadata, file);
  const json& saved = root.section("arguments");
  TrainingArguments a;
  a.num_layers = root.get<int64_t>(saved, "num_layers");
  a.hidden_size = root.get<int64_t>(saved, "hidden_size");
  a.ffn_hidden_size = root.get<int64_t>(saved, "ffn_hidden_size");
  a.num_attention_heads = root.get<int64_t>(saved, "num_attention_heads");
  a.seq_length = root.get<int64_t>(saved, "seq_length");
  a.max_position_embeddings = root.get<int64_t>(saved, "max_position_embeddings");
  a.make_vocab_size_divisible_by = root.get<int64_t>(saved, "make_vocab_size_divisible_by");
  a.tokenizer_type = root.get<std::string>(saved, "tokenizer_type");
  // Absent from checkpoints of before the SentencePiece tokenizers.
  if (saved.contains("tokenizer_model")) {
    a.tokenizer_model = root.get<std::string>(saved, "tokenizer_model");
  }
  a.vocab_size = root.get<int64_t>(saved, "vocab_size");
  a.tensor_model_parallel_size = root.get<int64_t>(saved, "tensor_model_parallel_size");
  a.pipeline_model_parallel_size = root.get<int64_t>(saved, "pipeline_model_parallel_size");
  // Absent from checkpoints of before pipeline parallelism.
  if (saved.contains("num_layers_per_virtual_pipeline_stage")) {
    a.num_layers_per_virtual_pipeline_stage =
        root.get<int64_t>(saved, "num_layers_per_virtual_pipeline_stage");
  }
  a.init_method_std = root.get<double>(saved, "init_method_std");
  a.norm_epsilon = root.get<double>(saved, "norm_epsilon");
  a.position_embedding_type = root.get<std::string>(saved, "position_embedding_type");
  a.rotary_base = root.get<int64_t>(saved, "rotary_base");
  a.rotary_percent = root.get<double>(saved, "rotary_percent");
  a.normalization = root.get<std::string>(saved, "normalization");
  // Absent in checkpoints from before the flag: plain LayerNorm weights.
  if (saved.contains("apply_layernorm_1p")) {
    a.apply_layernorm_1p = root.get<bool>(saved, "apply_layernorm_1p");
  }
  a.swiglu = root.get<bool>(saved, "swiglu");
  a.add_bias_linear = !root.get<bool>(saved, "disable_bias_linear");
  a.untie_embeddings_and_output_weights = root.get<bool>(saved, "untie_embeddings_and_output_weights");
  const auto num_query_groups = root.get<int64_t>(saved, "num_query_groups");
  a.group_query_attention = num_query_groups > 0;
  if (a.group_query_attention) a.num_query_groups = num_query_groups;
  a.hidden_dropout = root.get<double>(saved, "hidden_dropout");
  a.attention_dropout = root.get<double>(saved, "attention_dropout");
  a.micro_batch_size = root.get<int64_t>(saved, "micro_batch_size");
  a.global_batch_size = root.get<int64_t>(saved, "global_batch_size");
  a.train_iters = root.get<int64_t>(saved, "train_iters");
  a.seed = root.get<uint64_t>(saved, "seed");
  a.lr = root.get<double>(saved, "lr");
  a.min_lr = root.get<double>(saved, "min_lr");
  a.lr_decay_style = root.get<std::string>(saved, "lr_decay_style");
  a.lr_warmup_iters = root.get<int64_t>(saved, "lr_warmup_iters");
  a.lr_decay_iters = root.get<int64_t>(saved, "lr_decay_iters");
  a.lr_warmup_init = root.get<double>(saved, "lr_warmup_init");
  a.weight_decay = root.get<double>(saved, "weight_decay");
  a.clip_grad = root.get<double>(saved, "clip_grad");
  a.adam_beta1 = root.get<double>(saved, "adam_beta1");
  a.adam_beta2 = root.get<double>(saved, "adam_beta2");
  a.adam_eps = root.get<double>(saved, "adam_eps");
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
  if (arguments.load.empty()) {
    common::fail("--use-checkpoint-args needs --load DIR: the checkpoint whose arguments give the "
                 "model's shape");
  }
  const TrainingArguments saved = read_saved_arguments(
      arguments.load, "--use-checkpoint-args: --load",
      "point --load at pretrain_gpt's --save directory, or give the model flags (--num-layers, "
      "--hidden-size, ...) instead");
  // Megatron prints each argument it takes: "Setting <name> to <value> from checkpoint".
  auto take = [&](std::string_view name, auto& target, const auto& value) {
    target = value;
    using Value = std::decay_t<decltype(value)>;
    std::string shown;
    if constexpr (std::is_same_v<Value, bool>) {
      shown = value ? "True" : "False";
    } else {
      shown = fmt::format("{}", value);
    }
    out << fmt::format("Setting {} to {} from checkpoint", name, shown) << std::endl;
  };
  auto unless_given = [&](std::string_view flag, std::string_view name, auto& target, const auto& value) {
    if (!given(flag)) take(name, target, value);
  };
  unless_given("--num-layers", "num_layers", arguments.num_layers, saved.num_layers);
  unless_given("--hidden-size", "hidden_size", arguments.hidden_size, saved.hidden_size);
  unless_given("--ffn-hidden-size", "ffn_hidden_size", arguments.ffn_hidden_size, saved.ffn_hidden_size);
  unless_given("--seq-length", "seq_length", arguments.seq_length, saved.seq_length);
  unless_given("--num-attention-heads", "num_attention_heads", arguments.num_attention_heads,
               saved.num_attention_heads);
  unless_given("--max-position-embeddings", "max_position_embeddings", arguments.max_position_embeddings,
               saved.max_position_embeddings);
  unless_given("--make-vocab-size-divisible-by", "make_vocab_size_divisible_by",
               arguments.make_vocab_size_divisible_by, saved.make_vocab_size_divisible_by);
  unless_given("--vocab-size", "vocab_size", arguments.vocab_size, saved.vocab_size);
  unless_given("--norm-epsilon", "norm_epsilon", arguments.norm_epsilon, saved.norm_epsilon);
  take("group_query_attention", arguments.group_query_attention, saved.group_query_attention);
  take("num_query_groups", arguments.num_query_groups, saved.num_query_groups);
  take("position_embedding_type", arguments.position_embedding_type, saved.position_embedding_type);
  take("rotary_base", arguments.rotary_base, saved.rotary_base);
  take("rotary_percent", arguments.rotary_percent, saved.rotary_percent);
  take("add_bias_linear", arguments.add_bias_linear, saved.add_bias_linear);
  take("swiglu", arguments.swiglu, saved.swiglu);
  take("untie_embeddings_and_output_weights", arguments.untie_embeddings_and_output_weights,
       saved.untie_embeddings_and_output_weights);
  take("apply_layernorm_1p", arguments.apply_layernorm_1p, saved.apply_layernorm_1p);
  take("normalization", arguments.normalization, saved.normalization);
  take("hidden_dropout", arguments.hidden_dropout, saved.hidden_dropout);
  take("attention_dropout", arguments.attention_dropout, saved.attention_dropout);
  take("tokenizer_type", arguments.tokenizer_type, saved.tokenizer_type);
  // Megatron forces the checkpoint's path too; a path given here wins (the run that saved it may
  // have read the file elsewhere). None recorded: nothing to take.
  if (!saved.tokenizer_model.empty()) {
    unless_given("--tokenizer-model", "tokenizer_model", arguments.tokenizer_model, saved.tokenizer_model);
  }
}

CheckpointSaveOptions checkpoint_save_options(const TrainingArguments& a) {
  return {.directory = a.save,
          .no_save_optim = a.no_save_optim,
          .no_save_rng = a.no_save_rng,
          .arguments = checkpoint_arguments(a),
          .args = argument_values(a),
          .command_line = a.command_line};
}

CheckpointLoadOptions checkpoint_load_options(const TrainingArguments& a) {
  return {.directory = a.load,
          .finetune = a.finetune,
          .no_load_optim = a.no_load_optim,
          .no_load_rng = a.no_load_rng,
          .use_checkpoint_opt_param_scheduler = a.use_checkpoint_opt_param_scheduler,
          .override_opt_param_scheduler = a.override_opt_param_scheduler,
          .arguments = checkpoint_arguments(a),
          .command_line = a.command_line};
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
