// checkpoint_util: Megatron-LM's tools/checkpoint/convert.py for this backend's checkpoints and
// Hugging Face models (docs/checkpoints.md, "Hugging Face export"):
//   checkpoint_util --load <checkpoint dir> --export-hf <dir>
//       the weights of the checkpoint the tracker names → config.json + model.safetensors
//       (GPT2LMHeadModel or LlamaForCausalLM), the launcher's conversion stage
//   checkpoint_util --import-hf <dir> --save <checkpoint dir>
//       a Hugging Face directory → a release checkpoint (weights only) that
//       pretrain_gpt --load starts from; the flags that build its model are printed
// Exit status as pretrain_gpt: 0 done, 2 a user error (one line naming the flag or file),
// 3 an internal error.
#include <CLI/CLI.hpp>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <iostream>

#include "backend/ckpt/checkpoint.hpp"
#include "backend/ckpt/checkpoint_conversion.hpp"
#include "backend/ckpt/hf_format.hpp"
#include "backend/common/error.hpp"
#include "backend/common/logging.hpp"

namespace {

struct Options {
  std::string load, export_hf, import_hf, save;
};

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

int run(const Options& options, const std::vector<std::string>& command_line) {
  if (!options.load.empty()) {
    const auto model = backend::load_checkpoint_weights(options.load, std::cout);
    backend::export_hf(options.export_hf, model);
    const auto json = backend::hf_config_json(model.config());
    std::cout << fmt::format(" exported {} parameters as {} to {}\n", model.parameters().size(),
                             json["architectures"][0].get<std::string>(), options.export_hf);
    return 0;
  }
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
    Options options;
    CLI::App app{"Convert between checkpoints and Hugging Face models", "checkpoint_util"};
    auto* load = app.add_option("--load", options.load, "Checkpoint directory to export (--save of a run)");
    auto* export_hf = app.add_option("--export-hf", options.export_hf,
                                     "Write the checkpoint's model here as a Hugging Face directory");
    auto* import_hf = app.add_option("--import-hf", options.import_hf,
                                     "Hugging Face directory (config.json, model.safetensors) to import");
    auto* save = app.add_option("--save", options.save, "Checkpoint directory to write the import to");
    load->needs(export_hf);
    export_hf->needs(load);
    import_hf->needs(save);
    save->needs(import_hf);
    load->excludes(import_hf);
    try {
      app.parse(argc, argv);
    } catch (const CLI::CallForHelp&) {
      std::cout << app.help();
      return 0;
    } catch (const CLI::ParseError& error) {
      common::fail("checkpoint_util: {} (usage: --load DIR --export-hf DIR, or --import-hf DIR "
                   "--save DIR)", error.what());
    }
    if (options.load.empty() && options.import_hf.empty()) {
      common::fail("checkpoint_util: nothing to do: give --load DIR --export-hf DIR, or "
                   "--import-hf DIR --save DIR");
    }
    return run(options, std::vector<std::string>(argv, argv + argc));
  } catch (const common::Error& error) {
    spdlog::error("{}", error.what());
    return 2;
  } catch (const std::exception& error) {
    spdlog::critical("internal error (please report): {}", error.what());
    return 3;
  }
}
