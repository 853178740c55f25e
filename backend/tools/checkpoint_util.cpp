// checkpoint_util: Megatron-LM's tools/checkpoint/convert.py for this backend's checkpoints and
// Hugging Face models (docs/checkpoints.md, "Hugging Face export"):
//   checkpoint_util --load <checkpoint dir> --export-hf <dir>
//       the weights of the checkpoint the tracker names → config.json + model.safetensors
//       (GPT2LMHeadModel or LlamaForCausalLM), the launcher's conversion stage
//   checkpoint_util --import-hf <dir> --save <checkpoint dir> [--replace-training-tracker]
//       a Hugging Face directory → a release checkpoint (weights only) that
//       pretrain_gpt --load starts from; the flags that build its model are printed. Refused
//       while a live run holds the directory's save.lock, and, without the flag, when its
//       tracker names a training iteration.
//   checkpoint_util --load <checkpoint dir> --export-nemo <file.nemo>
//       the same weights as NeMo's .nemo archive (model_config.yaml + model_weights.ckpt,
//       ckpt/nemo_archive.hpp), the launcher's conversion stage's megatron_gpt.nemo
//   checkpoint_util --import-nemo <file.nemo> --save <checkpoint dir> [--replace-training-tracker]
//       a NeMo GPT's .nemo → a release checkpoint, its tokenizer files beside it
//   checkpoint_util --load <checkpoint dir> --save <new dir> --target-tensor-parallel-size N
//       [--target-pipeline-parallel-size P] [--make-vocab-size-divisible-by D]
//       the checkpoint the tracker names, resharded to N tensor-parallel ranks and P pipeline
//       stages with its whole state (ckpt/checkpoint_reshard.hpp), for pretrain_gpt
//       --tensor-model-parallel-size N --pipeline-model-parallel-size P --load <new dir>;
//       prints how to continue. <checkpoint dir> may be a Megatron-LM run's (--ckpt-format
//       torch): converted into this backend's format with its weights, progress, Adam state and
//       schedule (not its RNG state, nor a distributed optimizer's state).
//   checkpoint_util --model-type GPT --loader megatron --saver megatron --load-dir <dir>
//       --save-dir <new dir> [--target-tensor-parallel-size N] [--target-pipeline-parallel-size P]
//       [--saver-transformer-impl transformer_engine|local]
//       Megatron's convert.py spelling: the same resharding, written in Megatron-LM's format
//       (--ckpt-format torch), at the checkpoint's own sizes where no target is given.
// The command line is parsed by backend/ckpt/checkpoint_util_options.hpp.
// Exit status as pretrain_gpt: 0 done, 2 a user error (one line naming the flag or file),
// 3 an internal error.
#include <fmt/ranges.h>

#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>

#include "backend/ckpt/checkpoint.hpp"
#include "backend/ckpt/checkpoint_conversion.hpp"
#include "backend/ckpt/checkpoint_reshard.hpp"
#include "backend/ckpt/checkpoint_util_options.hpp"
#include "backend/ckpt/hf_format.hpp"
#include "backend/ckpt/nemo_archive.hpp"
#include "backend/common/logging.hpp"
#include "backend/common/tool_main.hpp"
#include "backend/train/checkpoint_arguments.hpp"

namespace {

// The pretrain_gpt flags that rebuild a model saved from `a` (arguments_for_model).
std::vector<std::string> model_flags(const backend::CheckpointModelRecord& a) {
  const backend::ModelArguments& model = a.model;
  std::vector<std::string> flags = {
      "--num-layers", std::to_string(model.num_layers),
      "--hidden-size", std::to_string(model.hidden_size),
      "--ffn-hidden-size", std::to_string(model.ffn_hidden_size),
      "--num-attention-heads", std::to_string(model.num_attention_heads),
      "--max-position-embeddings", std::to_string(model.max_position_embeddings),
      "--norm-epsilon", fmt::format("{}", model.norm_epsilon),
      "--tokenizer-type", a.tokenizer.tokenizer_type};
  if (model.position_embedding_type == backend::PositionEmbeddingType::rope) {
    flags.insert(flags.end(), {"--position-embedding-type", "rope", "--rotary-base",
                               std::to_string(model.rotary_base)});
    if (model.rotary_percent != 1.0) {
      flags.insert(flags.end(), {"--rotary-percent", fmt::format("{}", model.rotary_percent)});
    }
    if (model.use_rope_scaling) {
      flags.insert(flags.end(), {"--use-rope-scaling", "--rope-scaling-factor",
                                 fmt::format("{}", model.rope_scaling_factor)});
    }
  }
  if (model.normalization == backend::Normalization::rms_norm) {
    flags.insert(flags.end(), {"--normalization", "RMSNorm"});
  }
  if (model.swiglu) flags.push_back("--swiglu");
  if (!model.add_bias_linear) flags.push_back("--disable-bias-linear");
  if (model.untie_embeddings_and_output_weights) {
    flags.push_back("--untie-embeddings-and-output-weights");
  }
  if (model.group_query_attention) {
    flags.insert(flags.end(), {"--group-query-attention", "--num-query-groups",
                               std::to_string(model.num_query_groups)});
  }
  if (a.tokenizer.tokenizer_type == "NullTokenizer") {
    flags.insert(flags.end(), {"--vocab-size", std::to_string(a.tokenizer.vocab_size)});
  }
  if (!a.tokenizer.tokenizer_model.empty()) {  // a SentencePiece type's vocabulary is the model's
    flags.insert(flags.end(), {"--tokenizer-model", a.tokenizer.tokenizer_model});
  }
  flags.insert(flags.end(), {"--make-vocab-size-divisible-by",
                             std::to_string(model.make_vocab_size_divisible_by)});
  return flags;
}

// The args of a Megatron-format file of the converted checkpoint, from the file's metadata: the
// run's recorded arguments where the checkpoint is ours (the model's alone where it is
// Megatron's, whose record has no others) at the target's sizes, with its --bf16 / --fp16.
nlohmann::json converted_megatron_args(const nlohmann::json& metadata,
                                       backend::MegatronModuleSpec spec) {
  const std::filesystem::path file("the converted checkpoint");
  const backend::CheckpointMetadata root(metadata, file);
  const bool whole_record = root.section("arguments").contains("lr");
  backend::TrainingArguments a =
      whole_record ? backend::arguments_from_checkpoint(metadata, file)
                   : backend::arguments_with_model(backend::read_model_record(root, file));
  const backend::MixedPrecision precision = backend::recorded_mixed_precision(metadata);
  a.precision.bf16 = precision == backend::MixedPrecision::bf16;
  a.precision.fp16 = precision == backend::MixedPrecision::fp16;
  a.parallelism.world_size =
      a.parallelism.tensor_model_parallel_size * a.parallelism.pipeline_model_parallel_size;
  a.checkpointing.ckpt_format = backend::CheckpointFormat::torch;
  a.checkpointing.transformer_impl = spec;
  return backend::megatron_arguments(a);
}

// --target-tensor-parallel-size (or Megatron's --saver): reshard, then say how to resume and
// what changed.
int reshard(const backend::CheckpointUtilOptions& options,
            const std::vector<std::string>& command_line) {
  int64_t target_tensor_parallel = options.target_tensor_parallel_size;
  int64_t target_pipeline_parallel = options.target_pipeline_parallel_size;
  std::optional<backend::MegatronFileFormat> megatron;
  if (options.megatron_converter) {
    // Megatron's savers keep the checkpoint's sizes where no target is given.
    const backend::TrainingArguments source =
        backend::read_saved_arguments(options.load, "--load-dir");
    if (target_tensor_parallel == 0) {
      target_tensor_parallel = source.parallelism.tensor_model_parallel_size;
    }
    if (target_pipeline_parallel == 0) {
      target_pipeline_parallel = source.parallelism.pipeline_model_parallel_size;
    }
    const backend::MegatronModuleSpec spec = options.saver_transformer_impl;
    megatron = backend::MegatronFileFormat{.args =
                                               [spec](const nlohmann::json& metadata) {
                                                 return converted_megatron_args(metadata, spec);
                                               },
                                           .spec = spec};
  }
  const auto result = backend::reshard_checkpoint(
      {.load = options.load,
       .save = options.save,
       .target_tensor_parallel = target_tensor_parallel,
       .target_pipeline_parallel = target_pipeline_parallel,
       .make_vocab_size_divisible_by = options.make_vocab_size_divisible_by,
       .command_line = command_line,
       .megatron = megatron ? &*megatron : nullptr},
      std::cout);
  const backend::CheckpointModelRecord& target = result.target_arguments;
  const std::string what =
      result.release ? std::string("the release checkpoint")
                     : fmt::format("iteration {}", result.iteration);
  // The pipeline flags are spelled out once either side is pipelined: the run's own flags may
  // name another size (or an interleaved schedule the target no longer has).
  const bool pipelined =
      result.source_pipeline_parallel > 1 || target.parallelism.pipeline_model_parallel_size > 1;
  std::string pipeline_flags;
  if (pipelined) {
    pipeline_flags = fmt::format(" --pipeline-model-parallel-size {}",
                                 target.parallelism.pipeline_model_parallel_size);
    if (target.parallelism.num_layers_per_virtual_pipeline_stage > 0) {
      pipeline_flags += fmt::format(" --num-layers-per-virtual-pipeline-stage {}",
                                    target.parallelism.num_layers_per_virtual_pipeline_stage);
    }
  }
  // "--tensor-model-parallel-size 2 to 1", or both sizes in full on either side when pipelined.
  const std::string sizes =
      pipelined
          ? fmt::format(
                "--tensor-model-parallel-size {} --pipeline-model-parallel-size {} to "
                "--tensor-model-parallel-size {} --pipeline-model-parallel-size {}",
                result.source_tensor_parallel, result.source_pipeline_parallel,
                target.parallelism.tensor_model_parallel_size,
                target.parallelism.pipeline_model_parallel_size)
          : fmt::format("--tensor-model-parallel-size {} to {}", result.source_tensor_parallel,
                        target.parallelism.tensor_model_parallel_size);
  if (megatron) {
    std::cout << fmt::format(
        " written in Megatron-LM's format (--ckpt-format torch, the names of "
        "--transformer-impl {}); Megatron-LM loads it with --no-load-rng\n",
        common::enum_name(options.saver_transformer_impl));
  }
  std::cout << fmt::format(
      " resharded {} of {} from {} into {}; continue with\n"
      "   pretrain_gpt <the run's flags> --tensor-model-parallel-size {}{} "
      "--make-vocab-size-divisible-by {} --load {}\n",
      what, options.load, sizes, options.save, target.parallelism.tensor_model_parallel_size,
      pipeline_flags, target.model.make_vocab_size_divisible_by, options.save);
  // A checkpoint saved without them (or Megatron's, whose RNG state does not map, and whose
  // distributed optimizer's state is not read yet) loads with the switches that do without them.
  std::vector<std::string> switches, missing;
  if (!result.optimizer_state) {
    switches.push_back("--no-load-optim");
    missing.push_back("optimizer");
  }
  if (!result.rng_state) {
    switches.push_back("--no-load-rng");
    missing.push_back("RNG");
  }
  if (!switches.empty()) {
    std::cout << fmt::format("   adding {} (the checkpoint has no {} state)\n",
                             fmt::join(switches, " "), fmt::join(missing, " or "));
  }
  if (!result.optimizer_not_read.empty()) {
    std::cout << fmt::format("   (its optimizer state is not carried: {})\n",
                             result.optimizer_not_read);
  }
  if (pipelined) {
    std::cout << fmt::format(
        "   on a multiple of {} processes (tensor × pipeline; the rest is data parallel){}\n",
        target.parallelism.tensor_model_parallel_size *
            target.parallelism.pipeline_model_parallel_size,
        result.interleaving_dropped ? ", without --num-layers-per-virtual-pipeline-stage" : "");
  }
  if (result.target_padded_vocab_size != result.source_padded_vocab_size) {
    std::cout << fmt::format(
        " note: the padded vocabulary changed from {} to {} rows; the padded logits are part of "
        "the softmax, so the losses differ slightly from those the run would have had{}\n",
        result.source_padded_vocab_size, result.target_padded_vocab_size,
        result.divisor_keeping_padding > 0
            ? fmt::format(" (--make-vocab-size-divisible-by {} keeps {} rows)",
                          result.divisor_keeping_padding, result.source_padded_vocab_size)
            : std::string());
  }
  return 0;
}

int run(const backend::CheckpointUtilOptions& options, const std::vector<std::string>& command_line) {
  if (options.resharding()) return reshard(options, command_line);
  if (!options.load.empty()) {
    const auto model = backend::load_checkpoint_weights(options.load, std::cout);
    if (!options.export_hf.empty()) {
      backend::export_hf(options.export_hf, model);
      const auto json = backend::hf_config_json(model.config());
      std::cout << fmt::format(" exported {} parameters as {} to {}\n", model.parameters().size(),
                               json["architectures"][0].get<std::string>(), options.export_hf);
    }
    if (!options.export_nemo.empty()) {
      backend::CheckpointModelRecord record =
          backend::read_saved_model_record(options.load, "--load");
      backend::export_nemo(options.export_nemo, model, record,
                           {.vocab_file = options.vocab_file, .merge_file = options.merge_file});
      std::cout << fmt::format(" exported {} parameters as a NeMo archive to {}\n",
                               model.parameters().size(), options.export_nemo);
    }
    return 0;
  }
  // Held from the check to the save: no run can start saving there in between.
  const common::ExclusiveFileLock save_lock = backend::lock_save_directory(options.save);
  backend::check_release_destination(options.save, options.replace_training_tracker);
  std::optional<backend::GptModel<float>> model;
  backend::CheckpointModelRecord record;
  std::string tokenizer, source;
  std::vector<std::string> tokenizer_flags;
  if (!options.import_hf.empty()) {
    source = options.import_hf;
    model.emplace(backend::import_hf(options.import_hf));
    record = backend::arguments_for_model(model->config());
    tokenizer =
        backend::record_hf_tokenizer(record, options.import_hf, model->config().vocab_size);
  } else {
    source = options.import_nemo;
    // The tokenizer's files go beside the checkpoint, where the printed flags name them.
    backend::NemoImport imported = backend::import_nemo(
        options.import_nemo, std::filesystem::path(options.save) / "nemo_tokenizer");
    record = imported.record;
    tokenizer_flags = imported.tokenizer_flags;
    model.emplace(std::move(imported.model));
    tokenizer = fmt::format("tokenizer: {} (the archive's)", record.tokenizer.tokenizer_type);
  }
  // Saved as pretrain_gpt saves: the record and the arguments dump of a run with these flags.
  backend::TrainingArguments arguments = backend::arguments_with_model(record);
  arguments.checkpointing.save = options.save;
  arguments.checkpointing.no_save_optim = true;
  arguments.checkpointing.no_save_rng = true;
  arguments.command_line = command_line;
  backend::save_release_checkpoint(arguments, *model, std::cout);
  std::vector<std::string> flags = model_flags(record);
  flags.insert(flags.end(), tokenizer_flags.begin(), tokenizer_flags.end());
  std::cout << " " << tokenizer << '\n';
  std::cout << fmt::format(
      " imported {} parameters from {}; continue training with\n"
      "   pretrain_gpt {} --load {} ...\n",
      model->parameters().size(), source, fmt::join(flags, " "), options.save);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  common::setup_logging("checkpoint_util");
  return common::run_tool([&] {
    const auto options = backend::parse_checkpoint_util_arguments(argc, argv);
    if (!options) return 0;  // --help
    return run(*options, std::vector<std::string>(argv, argv + argc));
  });
}
