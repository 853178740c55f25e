// See checkpoint_util_options.hpp.
#include "backend/ckpt/checkpoint_util_options.hpp"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <span>
#include <string_view>

#include "backend/common/command_line.hpp"
#include "backend/common/error.hpp"
#include "backend/common/flag_rules.hpp"

namespace backend {

namespace {

constexpr std::string_view kTransformerImplementations[] = {"transformer_engine", "local"};

// The value rules of the flags (common/flag_rules.hpp): sizes are positive integers.
constexpr common::FlagRule kCheckpointUtilFlagRules[] = {
    common::text_flag("--load"),
    common::text_flag("--export-hf"),
    common::text_flag("--import-hf"),
    common::text_flag("--export-nemo"),
    common::text_flag("--import-nemo"),
    common::text_flag("--vocab-file"),
    common::text_flag("--merge-file"),
    common::text_flag("--save"),
    common::integer_flag("--target-tensor-parallel-size", 1),
    common::integer_flag("--target-pipeline-parallel-size", 1),
    common::integer_flag("--make-vocab-size-divisible-by", 1),
    common::text_flag("--model-type"),
    common::text_flag("--loader"),
    common::text_flag("--saver"),
    common::text_flag("--load-dir"),
    common::text_flag("--save-dir"),
    common::choice_flag("--saver-transformer-impl", kTransformerImplementations),
    common::text_flag("--loader-transformer-impl"),
    common::text_flag("--megatron-path"),
    common::integer_flag("--max-queue-size", 1),
};

// Megatron's loader and saver plugins (tools/checkpoint/loader_*.py, saver_*.py) that read and
// write what this tool does: a Megatron checkpoint (or ours) in, Megatron core's format out.
constexpr std::string_view kLoaders[] = {"megatron", "mcore", "core", "legacy"};
constexpr std::string_view kSavers[] = {"megatron", "mcore", "core"};

bool one_of(std::span<const std::string_view> names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

// Megatron's spelling (tools/checkpoint/convert.py) into this tool's options: --load-dir is
// --load; --save-dir is --save in Megatron's format.
void take_converter_spelling(CheckpointUtilOptions& options, const CLI::App& app,
                             const std::string& model_type, std::string loader, std::string saver,
                             const std::string& load_dir, const std::string& save_dir,
                             const std::string& saver_transformer_impl) {
  for (const char* ours :
       {"--load", "--save", "--export-hf", "--import-hf", "--export-nemo", "--import-nemo"}) {
    if (app.count(ours) > 0) {
      common::fail(
          "checkpoint_util: {} is this tool's spelling, and --model-type, --loader, "
          "--saver, --load-dir and --save-dir Megatron's convert.py's: give one or the "
          "other",
          ours);
    }
  }
  if (model_type.empty()) {
    common::fail(
        "checkpoint_util: --model-type is required with Megatron's spelling (GPT), as "
        "convert.py requires it");
  }
  if (model_type != "GPT") {
    common::fail(
        "checkpoint_util: --model-type {}: not built; the models here are GPT's "
        "(--model-type GPT)",
        model_type);
  }
  if (loader.empty()) loader = "megatron";  // convert.py's defaults
  if (saver.empty()) saver = "megatron";
  if (!one_of(kLoaders, loader)) {
    common::fail(
        "checkpoint_util: --loader {}: not built; megatron, mcore, core and legacy read "
        "a Megatron-LM checkpoint or one of this backend's (a Hugging Face model is "
        "imported with --import-hf DIR --save DIR)",
        loader);
  }
  if (!one_of(kSavers, saver)) {
    common::fail(
        "checkpoint_util: --saver {}: not built; megatron, mcore and core write "
        "Megatron-LM's format in Megatron core's names (this backend's format is "
        "--load DIR --save DIR; Hugging Face's --export-hf DIR)",
        saver);
  }
  if (load_dir.empty() || save_dir.empty()) {
    common::fail(
        "checkpoint_util: --load-dir (the checkpoint to convert) and --save-dir (the "
        "directory to write it to) are both required, as in convert.py");
  }
  options.load = load_dir;
  options.save = save_dir;
  options.megatron_converter = true;
  // Its flag rule has taken only the enum's names.
  options.saver_transformer_impl = common::enum_from_name_or_fail<MegatronModuleSpec>(
      saver_transformer_impl, "--saver-transformer-impl");
  // convert.py's savers keep the checkpoint's sizes where no target is given.
  if (app.count("--target-pipeline-parallel-size") == 0) options.target_pipeline_parallel_size = 0;
}

}  // namespace

std::optional<CheckpointUtilOptions> parse_checkpoint_util_arguments(int argc, const char* const* argv) {
  CheckpointUtilOptions options;
  CLI::App app{"Convert checkpoints: to and from Hugging Face models and NeMo archives, and to "
               "another "
               "tensor- and pipeline-parallel size", "checkpoint_util"};
  auto* load = app.add_option("--load", options.load,
                              "Checkpoint directory to read (the --save of a run, ours or "
                              "Megatron-LM's --ckpt-format torch): the checkpoint its tracker "
                              "names");
  auto* export_hf = app.add_option("--export-hf", options.export_hf,
                                   "Write the checkpoint's model here as a Hugging Face directory");
  auto* import_hf = app.add_option("--import-hf", options.import_hf,
                                   "Hugging Face directory (config.json, model.safetensors) to import");
  auto* export_nemo = app.add_option("--export-nemo", options.export_nemo,
                                     "Write the checkpoint's model here as a NeMo .nemo archive "
                                     "(model_config.yaml, model_weights.ckpt)");
  auto* import_nemo = app.add_option("--import-nemo", options.import_nemo,
                                     "NeMo .nemo archive to import (NeMo 1.x's GPT, mcore_gpt "
                                     "false)");
  auto* vocab_file = app.add_option("--vocab-file", options.vocab_file,
                                    "--export-nemo: GPT-2 BPE's vocab.json, packed into the "
                                    "archive (NeMo's conversion.model.vocab_file)");
  auto* merge_file = app.add_option("--merge-file", options.merge_file,
                                    "--export-nemo: GPT-2 BPE's merges.txt, packed in likewise");
  auto* save = app.add_option("--save", options.save,
                              "Checkpoint directory to write: the import, or the resharded "
                              "checkpoint (a directory other than --load)");
  auto* replace = app.add_flag("--replace-training-tracker", options.replace_training_tracker,
                               "Import even into a directory whose tracker names a training "
                               "iteration (the tracker then says release; iter_* stay)");
  auto* target_tp = app.add_option(
      "--target-tensor-parallel-size", options.target_tensor_parallel_size,
      "Reshard --load into --save at this tensor-parallel size: parameters, optimizer state and "
      "progress, for pretrain_gpt --tensor-model-parallel-size N --load <--save>");
  auto* target_pp = app.add_option(
      "--target-pipeline-parallel-size", options.target_pipeline_parallel_size,
      "Resharding: the pipeline-parallel size of the resharded checkpoint (default 1), a divisor "
      "of its --num-layers, for pretrain_gpt --pipeline-model-parallel-size P");
  auto* divisible = app.add_option(
      "--make-vocab-size-divisible-by", options.make_vocab_size_divisible_by,
      "Resharding: pad the vocabulary to a multiple of this × the target size (default: the "
      "checkpoint's value, as Megatron's saver); the rows are cut or padded to it");
  // Megatron's converter spelling (tools/checkpoint/convert.py and its core saver).
  std::string model_type, loader, saver, load_dir, save_dir, megatron_path;
  int64_t max_queue_size = 50;
  bool no_checking = false;
  std::string saver_transformer_impl = "transformer_engine", loader_transformer_impl;
  const std::string converter = "Megatron's convert.py spelling";
  app.add_option("--model-type", model_type, "GPT (convert.py's --model-type)")->group(converter);
  app.add_option("--loader", loader,
                 "megatron (default), mcore, core or legacy: read --load-dir, a Megatron-LM "
                 "checkpoint or one of this backend's")
      ->group(converter);
  app.add_option("--saver", saver,
                 "megatron (default), mcore or core: write --save-dir in Megatron-LM's format "
                 "(--ckpt-format torch, Megatron core's names)")
      ->group(converter);
  app.add_option("--load-dir", load_dir, "The checkpoint to convert (as --load)")->group(converter);
  app.add_option("--save-dir", save_dir, "Where to write it, in Megatron-LM's format")
      ->group(converter);
  app.add_option("--saver-transformer-impl", saver_transformer_impl,
                 "The module spec whose tensor names are written: transformer_engine (default) or "
                 "local")
      ->group(converter);
  app.add_option("--loader-transformer-impl", loader_transformer_impl,
                 "No effect: both specs' names are read")
      ->group(converter);
  app.add_option("--megatron-path", megatron_path, "No effect: no Megatron-LM code is run")
      ->group(converter);
  app.add_option("--max-queue-size", max_queue_size,
                 "No effect: convert.py's queue between its loader and saver processes")
      ->group(converter);
  app.add_flag("--no-checking", no_checking, "No effect: the names are always checked")
      ->group(converter);
  export_hf->needs(load);
  import_hf->needs(save);
  export_nemo->needs(load);
  vocab_file->needs(export_nemo);
  merge_file->needs(export_nemo);
  import_nemo->needs(save);
  load->excludes(import_hf);
  load->excludes(import_nemo);
  import_hf->excludes(import_nemo);
  export_hf->excludes(save);
  export_nemo->excludes(save);
  target_tp->excludes(export_hf);
  target_tp->excludes(import_hf);
  target_tp->excludes(export_nemo);
  target_tp->excludes(import_nemo);
  common::apply_flag_rules(app, kCheckpointUtilFlagRules);
  const common::RefusedFlags no_refused_flags(app, {});
  if (!common::parse_command_line(app, argc, argv, "checkpoint_util", no_refused_flags, "")) {
    return std::nullopt;
  }
  for (const char* flag : {"--model-type", "--loader", "--saver", "--load-dir", "--save-dir",
                           "--saver-transformer-impl", "--loader-transformer-impl",
                           "--megatron-path", "--max-queue-size", "--no-checking"}) {
    if (app.count(flag) > 0) {
      take_converter_spelling(options, app, model_type, loader, saver, load_dir, save_dir,
                              saver_transformer_impl);
      return options;
    }
  }
  for (const CLI::Option* option : {target_pp, divisible}) {
    if (option->count() > 0 && target_tp->count() == 0) {
      common::fail("checkpoint_util: {} requires --target-tensor-parallel-size",
                   option->get_name());
    }
  }
  if (replace->count() > 0 && !options.importing()) {
    common::fail("checkpoint_util: --replace-training-tracker requires --import-hf DIR or "
                 "--import-nemo FILE");
  }
  if (options.load.empty() && !options.importing()) {
    common::fail("checkpoint_util: nothing to do: give --load DIR --export-hf DIR, --load DIR "
                 "--export-nemo FILE, --import-hf DIR --save DIR, --import-nemo FILE --save DIR, "
                 "or --load DIR --save DIR --target-tensor-parallel-size N "
                 "[--target-pipeline-parallel-size P]");
  }
  if (options.resharding()) {
    if (options.load.empty() || options.save.empty()) {
      common::fail("checkpoint_util: --target-tensor-parallel-size requires --load (the "
                   "checkpoint to reshard) and --save (the directory to write it to)");
    }
  } else if (!options.load.empty() && options.export_hf.empty() && options.export_nemo.empty()) {
    common::fail("checkpoint_util: --load requires --export-hf DIR (export to Hugging Face), "
                 "--export-nemo FILE (export to NeMo), or --save DIR with "
                 "--target-tensor-parallel-size N (reshard)");
  }
  return options;
}

}  // namespace backend
