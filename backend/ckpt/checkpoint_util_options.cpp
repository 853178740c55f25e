// See checkpoint_util_options.hpp.
#include "backend/ckpt/checkpoint_util_options.hpp"

#include <CLI/CLI.hpp>

#include "backend/common/command_line.hpp"
#include "backend/common/error.hpp"
#include "backend/common/flag_rules.hpp"

namespace backend {

namespace {

// The value rules of the flags (common/flag_rules.hpp): sizes are positive integers.
constexpr common::FlagRule kCheckpointUtilFlagRules[] = {
    common::text_flag("--load"),
    common::text_flag("--export-hf"),
    common::text_flag("--import-hf"),
    common::text_flag("--save"),
    common::integer_flag("--target-tensor-parallel-size", 1),
    common::integer_flag("--target-pipeline-parallel-size", 1),
    common::integer_flag("--make-vocab-size-divisible-by", 1),
};

}  // namespace

std::optional<CheckpointUtilOptions> parse_checkpoint_util_arguments(int argc, const char* const* argv) {
  CheckpointUtilOptions options;
  CLI::App app{"Convert checkpoints: to and from Hugging Face models, and to another "
               "tensor- and pipeline-parallel size", "checkpoint_util"};
  auto* load = app.add_option("--load", options.load,
                              "Checkpoint directory to read (the --save of a run, ours or "
                              "Megatron-LM's --ckpt-format torch): the checkpoint its tracker "
                              "names");
  auto* export_hf = app.add_option("--export-hf", options.export_hf,
                                   "Write the checkpoint's model here as a Hugging Face directory");
  auto* import_hf = app.add_option("--import-hf", options.import_hf,
                                   "Hugging Face directory (config.json, model.safetensors) to import");
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
  export_hf->needs(load);
  import_hf->needs(save);
  replace->needs(import_hf);
  load->excludes(import_hf);
  export_hf->excludes(save);
  target_tp->excludes(export_hf);
  target_tp->excludes(import_hf);
  target_pp->needs(target_tp);
  divisible->needs(target_tp);
  common::apply_flag_rules(app, kCheckpointUtilFlagRules);
  const common::RefusedFlags no_refused_flags(app, {});
  if (!common::parse_command_line(app, argc, argv, "checkpoint_util", no_refused_flags, "")) {
    return std::nullopt;
  }
  if (options.load.empty() && options.import_hf.empty()) {
    common::fail("checkpoint_util: nothing to do: give --load DIR --export-hf DIR, --import-hf "
                 "DIR --save DIR, or --load DIR --save DIR --target-tensor-parallel-size N "
                 "[--target-pipeline-parallel-size P]");
  }
  if (options.resharding()) {
    if (options.load.empty() || options.save.empty()) {
      common::fail("checkpoint_util: --target-tensor-parallel-size requires --load (the "
                   "checkpoint to reshard) and --save (the directory to write it to)");
    }
  } else if (!options.load.empty() && options.export_hf.empty()) {
    common::fail("checkpoint_util: --load requires --export-hf DIR (export to Hugging Face), or "
                 "--save DIR with --target-tensor-parallel-size N (reshard)");
  }
  return options;
}

}  // namespace backend
