// What a stage asks a cluster to run: one job, described independently of the scheduler.
// Stages (stages/*.cpp) build it from the resolved config; clusters (clusters/*.cpp) render
// it into a script and submit it.
#pragma once

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

namespace launcher {

struct JobSpec {
  std::string stage;                   // training, ...
  std::string run_name;                // <stage>.run.name
  std::string job_name;                // <cluster.job_name_prefix><run_name>
  std::filesystem::path results_dir;   // <stage>.run.results_dir
  std::vector<std::string> command;    // argv of the backend, unquoted
  std::vector<std::pair<std::string, std::string>> environment;  // exported, in order
  int nodes = 1;
  int tasks_per_node = 1;
  std::string time_limit;              // Slurm's D-HH:MM:SS, may be empty
  std::string tool;                    // the backend executable's name, for "not built" messages
  // Scheduler dependencies: the id of the job this one runs after (afterany), set by the
  // launcher from the last stage that submitted something, and <stage>.run.dependency
  // (e.g. "singleton"), passed to Slurm as is.
  std::string after_job_id;
  std::string run_dependency;
};

}  // namespace launcher
