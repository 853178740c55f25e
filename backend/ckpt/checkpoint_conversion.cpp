// Checkpoint ↔ model for checkpoint_util; see checkpoint_conversion.hpp.
#include "backend/ckpt/checkpoint_conversion.hpp"

#include <fmt/format.h>

#include "backend/ckpt/checkpoint.hpp"
#include "backend/ckpt/checkpoint_file.hpp"
#include "backend/ckpt/checkpoint_reshard.hpp"
#include "backend/common/error.hpp"
#include "backend/common/memory_estimate.hpp"
#include "backend/data/gpt2_bpe_tokenizer.hpp"
#include "backend/data/tokenizer.hpp"
#include "backend/optim/adamw.hpp"
#include "backend/optim/lr_scheduler.hpp"

namespace backend {

GptModel<float> load_checkpoint_weights(const std::filesystem::path& directory, std::ostream& out) {
  const CheckpointModelRecord arguments = read_saved_model_record(directory, "--load");
  // A tensor- or pipeline-parallel checkpoint: its files assembled into the one-process model
  // (load_checkpoint reads one rank's file, which holds a part of it).
  if (arguments.parallelism.tensor_model_parallel_size > 1 ||
      arguments.parallelism.pipeline_model_parallel_size > 1) {
    return load_whole_checkpoint_weights(directory, out);
  }
  // The saved arguments decide the model's size: checked before it is built.
  const GptConfig config = model_config(arguments);
  common::require_memory_fits(
      common::estimate_conversion_memory(model_shape(config)), common::available_memory(),
      fmt::format("--load {}: the model its saved arguments describe", directory.string()),
      "Convert it on a machine with more memory.");
  GptModel<float> model(config);
  AdamW optimizer(AdamWConfig{}, {}, static_cast<int64_t>(model.parameters().size()));
  LearningRateScheduler scheduler(LearningRateSchedule{.max_lr = 0, .decay_steps = 1});
  // Weights only: load_checkpoint reads no optimizer state with finetune.
  CheckpointLoadOptions options{.directory = directory, .finetune = true};
  record_model(arguments, options.arguments);
  load_checkpoint(options, model, optimizer, scheduler, out);
  return model;
}

CheckpointModelRecord arguments_for_model(const GptConfig& config) {
  CheckpointModelRecord a;
  a.model = model_arguments(config);
  if (config.vocab_size == kGpt2VocabSize) {
    a.tokenizer.tokenizer_type = "GPT2BPETokenizer";
  } else {
    if (config.vocab_size < 2) {
      common::fail(
          "a vocabulary of {} token(s) has no pretrain_gpt tokenizer (NullTokenizer "
          "needs --vocab-size ≥ 1 plus its EOD)",
          config.vocab_size);
    }
    a.tokenizer.tokenizer_type = "NullTokenizer";
    a.tokenizer.vocab_size = config.vocab_size - 1;
  }
  return a;
}

std::string record_hf_tokenizer(CheckpointModelRecord& arguments,
                                const std::filesystem::path& hf_directory,
                                int64_t model_vocab_size) {
  namespace fs = std::filesystem;
  if (arguments.tokenizer.tokenizer_type != "NullTokenizer") {
    return fmt::format("tokenizer: {} (GPT-2's vocabulary size)",
                       arguments.tokenizer.tokenizer_type);
  }
  std::error_code error;
  TokenizerOptions options;
  if (fs::is_regular_file(hf_directory / "tokenizer.model", error)) {
    options.tokenizer_type = "Llama2Tokenizer";
    options.tokenizer_model = fs::absolute(hf_directory / "tokenizer.model").string();
  } else if (fs::is_regular_file(hf_directory / "tokenizer.json", error)) {
    options.tokenizer_type = "HuggingFaceTokenizer";
    options.tokenizer_model = fs::absolute(hf_directory).string();
  } else {
    return fmt::format(
        "tokenizer: {} has neither tokenizer.model nor tokenizer.json, so the "
        "checkpoint records NullTokenizer; give the tokenizer's flags when training",
        hf_directory.string());
  }
  int64_t tokenizer_vocab_size = 0;
  try {
    tokenizer_vocab_size = build_tokenizer(options)->vocab_size();
  } catch (const common::Error& problem) {
    return fmt::format("tokenizer: not recorded ({}); give the tokenizer's flags when training",
                       problem.what());
  }
  if (tokenizer_vocab_size != model_vocab_size) {
    return fmt::format(
        "tokenizer: {} has {} ids and the model's vocabulary {} rows, so the "
        "checkpoint records NullTokenizer; give the tokenizer's flags when training",
        options.tokenizer_model, tokenizer_vocab_size, model_vocab_size);
  }
  arguments.tokenizer.tokenizer_type = options.tokenizer_type;
  arguments.tokenizer.tokenizer_model = options.tokenizer_model;
  arguments.tokenizer.vocab_size = 0;
  return fmt::format(
      "tokenizer: --tokenizer-type {} --tokenizer-model {} (the directory's, {} ids)",
      options.tokenizer_type, options.tokenizer_model, tokenizer_vocab_size);
}

}  // namespace backend
