// See checkpoint_util_options.hpp.
#include "backend/ckpt/checkpoint_util_options.hpp"

#include <CLI/CLI.hpp>

#include "backend/common/command_line.hpp"
#include "backend/common/error.hpp"

namespace backend {

std::optional<CheckpointUtilOptions> parse_checkpoint_util_arguments(int argc, const char* const* argv) {
  CheckpointUtilOptions options;
  CLI::App app{"Convert between checkpoints and Hugging Face models", "checkpoint_util"};
  auto* load = app.add_option("--load", options.load, "Checkpoint directory to export (--save of a run)");
  auto* export_hf = app.add_option("--export-hf", options.export_hf,
                                   "Write the checkpoint's model here as a Hugging Face directory");
  auto* import_hf = app.add_option("--import-hf", options.import_hf,
                                   "Hugging Face directory (config.json, model.safetensors) to import");
  auto* save = app.add_option("--save", options.save, "Checkpoint directory to write the import to");
  auto* replace = app.add_flag("--replace-training-tracker", options.replace_training_tracker,
                               "Import even into a directory whose tracker names a training "
                               "iteration (the tracker then says release; iter_* stay)");
  load->needs(export_hf);
  export_hf->needs(load);
  import_hf->needs(save);
  save->needs(import_hf);
  replace->needs(import_hf);
  load->excludes(import_hf);
  const common::RefusedFlags no_refused_flags(app, {});
  if (!common::parse_command_line(app, argc, argv, "checkpoint_util", no_refused_flags, "")) {
    return std::nullopt;
  }
  if (options.load.empty() && options.import_hf.empty()) {
    common::fail("checkpoint_util: nothing to do: give --load DIR --export-hf DIR, or "
                 "--import-hf DIR --save DIR");
  }
  return options;
}

}  // namespace backend
