// Stages: each turns its section of the resolved config into jobs (JobSpec), independent of
// the cluster. NeMo-Megatron-Launcher's stage set, in the order users list them:
//   data_preparation  preprocess_data   (JSONL → Megatron .bin/.idx); with file_urls also
//                     download and decompress, three jobs (data_preparation_stage.hpp)
//   training          pretrain_gpt      (Megatron flags from NeMo's training config)
//   conversion        checkpoint_util   (checkpoint → Hugging Face)
//   evaluation        evaluate_gpt      (validation/test loss of a checkpoint)
// A stage whose tool is not built yet still renders its script; the script refuses to run
// with a message naming the missing tool (see the templates' tool check).
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "launcher/config/node.hpp"
#include "launcher/stages/job.hpp"

namespace launcher {

struct StageContext {
  const Node& config;                     // resolved
  std::filesystem::path backend_bin_dir;  // where the backend executables live
  std::string job_name_prefix;            // cluster.job_name_prefix
};

// The stages this launcher runs (above), in that order.
const std::vector<std::string>& known_stages();

// Every stage name NeMo-Megatron-Launcher knows (its main.py's STR2STAGECLASS and the stage
// groups of its conf trees, 23.07 to 24.x), so that a NeMo `stages` list is understood: the
// one table of them, shown in docs/launcher.md ("NeMo's stages").
struct NemoStage {
  std::string_view name;
  std::string_view in_nemo;  // what the stage does in NeMo, one line
  std::string_view here;     // the tool that runs it here, or what to use instead
  bool runs_here;            // one of known_stages()
};
const std::vector<NemoStage>& nemo_stages();

// Refuses a `stages` list naming a stage that is not run here, before anything is written:
// for a NeMo stage, what it does in NeMo, what to use here, and the list without it; for any
// other name, the valid ones with a suggestion.
void check_stage_names(const std::vector<std::string>& stages);

// The stage's jobs in the order they run, each after the one before; none when the stage has
// nothing to submit (the dependency chain then continues from the stage before it). Unknown
// stage names are refused with the valid ones.
std::vector<JobSpec> build_stage_jobs(std::string_view stage, const StageContext& context);

// The parts every stage shares, read from `<stage>.run`: name, results_dir, time_limit,
// dependency; job_name = prefix + name. Missing `<stage>` section: an error naming the group
// to choose.
JobSpec job_from_run_section(std::string_view stage, const StageContext& context);

}  // namespace launcher
