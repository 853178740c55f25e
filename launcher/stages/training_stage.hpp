// The training stage: turns the resolved `training` config (NeMo's schema) into a
// pretrain_gpt command line with Megatron-LM's flags. The whole key → flag mapping is the one
// table kTrainingFlags in training_stage.cpp, listed in docs/launcher.md; keys that are null
// or absent pass no flag, so the backend's Megatron default applies. Every value is checked with
// the backend's rule for its flag before anything is queued.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "launcher/config/node.hpp"
#include "launcher/stages/job.hpp"
#include "launcher/stages/stage.hpp"

namespace launcher {

// One row of the mapping, for docs and tests.
struct TrainingFlagMapping {
  std::string config_key;  // relative to `training.`
  std::string flag;
  std::string note;
};
const std::vector<TrainingFlagMapping>& training_flag_table();

// Every config value the table maps to a flag, checked with the backend's own rule for that
// flag (backend/common/flag_rules.hpp), one problem per bad value, naming where it was set:
//   "training.model.optim.lr: 'abc' is not a number; --lr takes a real number ≥ 0 (from the
//   command line)".
// What pretrain_gpt refuses only because it is not built yet (tensor parallelism, a
// SentencePiece tokenizer) is not a value problem, so such configs still render.
std::vector<std::string> training_value_problems(const Node& config);

// The pretrain_gpt arguments (without the program) for a resolved config; a value that
// training_value_problems finds wrong is a common::Error listing them all.
std::vector<std::string> megatron_training_arguments(const Node& config);

// The training job: pretrain_gpt with those arguments, nodes and tasks from the trainer.
JobSpec build_training_job(const StageContext& context);

}  // namespace launcher
