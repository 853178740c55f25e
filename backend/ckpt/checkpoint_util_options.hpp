// checkpoint_util's command line (backend/tools/checkpoint_util.cpp), parsed and validated with
// no side effects (nothing read beyond argv, nothing written), so that it can be fuzzed:
//   --load DIR --export-hf DIR        a checkpoint → a Hugging Face directory
//   --import-hf DIR --save DIR        a Hugging Face directory → a release checkpoint
//       [--replace-training-tracker]  even when DIR's tracker names a training iteration
// Misuse is a common::Error naming the flag ("--load requires --export-hf", "nothing to do").
#pragma once

#include <optional>
#include <string>

namespace backend {

struct CheckpointUtilOptions {
  std::string load, export_hf, import_hf, save;
  bool replace_training_tracker = false;
};

// nullopt after --help (printed to stdout).
std::optional<CheckpointUtilOptions> parse_checkpoint_util_arguments(int argc, const char* const* argv);

}  // namespace backend
