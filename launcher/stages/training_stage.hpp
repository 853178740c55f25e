// The training stage: turns the resolved `training` config (NeMo's schema) into a
// pretrain_gpt command line with Megatron-LM's flags. The whole key → flag mapping is the one
// table kTrainingFlags in training_stage.cpp, listed in docs/launcher.md; keys that are null
// or absent pass no flag, so the backend's Megatron default applies. Every value is checked with
// the backend's rule for its flag before anything is queued.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
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
// What pretrain_gpt refuses only because it is not built yet (a HuggingFace tokenizer, say) is
// not a value problem, so such configs still render.
std::vector<std::string> training_value_problems(const Node& config);

// Lightning's trainer.limit_val_batches as Megatron's --eval-iters: an integer is a number of
// validation batches; a float a fraction of them (0.0 none, 1.0 all), of which only 0.0 is known
// before pretrain_gpt reads the data. nullopt when null or absent; a fraction above 0, a float
// above 1.0 and a bad integer are a common::Error naming the key and the valid forms.
std::optional<int64_t> validation_batches(const Node& config);

// NeMo's model.virtual_pipeline_model_parallel_size V, the model chunks per pipeline stage: 1 when
// null or absent. Expects a value that passed training_value_problems (an integer ≥ 1).
int64_t virtual_pipeline_chunks(const Node& config);

// NeMo's model.virtual_pipeline_model_parallel_size V (model chunks per pipeline stage) as
// Megatron's --num-layers-per-virtual-pipeline-stage K = num_layers / (pp × V) for the
// interleaved schedule; nullopt when V is null, absent or 1 (NeMo's MegatronBaseModel turns 1
// into None: one chunk per stage is the plain schedule). Expects values that passed
// training_value_problems; a num_layers that pp × V does not divide is a common::Error naming
// the keys, the same words as the preflight's.
std::optional<int64_t> layers_per_virtual_pipeline_stage(const Node& config);

// The pretrain_gpt arguments (without the program) for a resolved config; a value that
// training_value_problems finds wrong is a common::Error listing them all.
std::vector<std::string> megatron_training_arguments(const Node& config);

// The training job: pretrain_gpt with those arguments, nodes and tasks from the trainer.
JobSpec build_training_job(const StageContext& context);

}  // namespace launcher
