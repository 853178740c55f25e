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
// The command line is parsed by backend/ckpt/checkpoint_util_options.hpp.
// Exit status as pretrain_gpt: 0 done, 2 a user error (one line naming the flag or file),
// 3 an internal error.
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <iostream>

#include "backend/ckpt/checkpoint.hpp"
#include "backend/ckpt/checkpoint_util_options.hpp"
#include "backend/ckpt/hf_format.hpp"
#include "backend/common/error.hpp"
#include "backend/common/logging.hpp"
#include "backend/train/checkpoint_arguments.hpp"
#include "backend/train/checkpoint_conversion.hpp"

namespace {

// The pretrain_gpt flags that rebuild a model saved from `arguments` (arguments_for_model).
std::vector<std::string> model_flags(const backend::TrainingArguments& a) {
  std::vector<std::string> flags = {
      "--num-layers", std::to_string(a.num_layers),
      "--hidden-size", std::to_string(a.hidden_size),
      "--ffn-hidden-size", std::to_string(a.ffn_hidden_size),
      "--num-attention-heads", std::to_string(a.num_attention_heads),
      "--max-position-embeddings", std::to_string(a.max_position_embeddings),
      "--norm-epsilon", fmt::format("{}", a.norm_epsilon),
      "--tokenizer-type", a.tokenizer_type};
  if (a.position_embedding_type == "rope") {
    flags.insert(flags.end(), {"--position-embedding-type", "rope", "--rotary-base",
                               std::to_string(a.rotary_base)});
    if (a.rotary_percent != 1.0) {
      flags.insert(flags.end(), {"--rotary-percent", fmt::format("{}", a.rotary_percent)});
    }
  }
  if (a.normalization == "RMSNorm") flags.insert(flags.end(), {"--normalization", "RMSNorm"});
  if (a.swiglu) flags.push_back("--swiglu");
  if (!a.add_bias_linear) flags.push_back("--disable-bias-linear");
  if (a.untie_embeddings_and_output_weights) flags.push_back("--untie-embeddings-and-output-weights");
  if (a.group_query_attention) {
    flags.insert(flags.end(), {"--group-query-attention", "--num-query-groups",
                               std::to_string(a.num_query_groups)});
  }
  if (a.tokenizer_type == "NullTokenizer") {
    flags.insert(flags.end(), {"--vocab-size", std::to_string(a.vocab_size)});
  }
  flags.insert(flags.end(),
               {"--make-vocab-size-divisible-by", std::to_string(a.make_vocab_size_divisible_by)});
  return flags;
}

int run(const backend::CheckpointUtilOptions& options, const std::vector<std::string>& command_line) {
  if (!options.load.empty()) {
    const auto model = backend::load_checkpoint_weights(options.load, std::cout);
    backend::export_hf(options.export_hf, model);
    const auto json = backend::hf_config_json(model.config());
    std::cout << fmt::format(" exported {} parameters as {} to {}\n", model.parameters().size(),
                             json["architectures"][0].get<std::string>(), options.export_hf);
    return 0;
  }
  // Held from the check to the save: no run can start saving there in between.
  const common::ExclusiveFileLock save_lock = backend::lock_save_directory(options.save);
  backend::check_release_destination(options.save, options.replace_training_tracker);
  const auto model = backend::import_hf(options.import_hf);
  backend::TrainingArguments arguments = backend::arguments_for_model(model.config());
  arguments.save = options.save;
  arguments.no_save_optim = true;
  arguments.no_save_rng = true;
  arguments.command_line = command_line;
  backend::save_release_checkpoint(arguments, model, std::cout);
  std::cout << fmt::format(" imported {} parameters from {}; continue training with\n"
                           "   pretrain_gpt {} --load {} ...\n",
                           model.parameters().size(), options.import_hf,
                           fmt::join(model_flags(arguments), " "), options.save);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  common::setup_logging("checkpoint_util");
  try {
    const auto options = backend::parse_checkpoint_util_arguments(argc, argv);
    if (!options) return 0;  // --help
    return run(*options, std::vector<std::string>(argv, argv + argc));
  } catch (const common::Error& error) {
    spdlog::error("{}", error.what());
    return 2;
  } catch (const std::exception& error) {
    spdlog::critical("internal error (please report): {}", error.what());
    return 3;
  }
}
