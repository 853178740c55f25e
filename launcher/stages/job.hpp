// What a stage asks a cluster to run: one job, described independently of the scheduler.
// Stages (stages/*.cpp) build it from the resolved config; clusters (clusters/*.cpp) render
// it into a script and submit it. Most stages are one job; the data_preparation stage with
// downloads is several (download → decompress → preprocess), each a job array over files.
#pragma once

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

namespace launcher {

struct JobSpec {
  std::string stage;                   // training, ...
  std::string step;                    // within a stage of several jobs (download, ...); else empty
  std::string run_name;                // <stage>.run.name
  std::string job_name;                // <cluster.job_name_prefix><run_name>[_<step>]
  std::filesystem::path results_dir;   // <stage>.run.results_dir
  std::vector<std::string> command;    // argv of the backend, unquoted
  // A job array: task i runs array_tasks[i] (Slurm: --array=0-N, the task picked by
  // SLURM_ARRAY_TASK_ID; local: the tasks one after the other). Empty: `command` is the job.
  std::vector<std::vector<std::string>> array_tasks;
  int max_parallel_tasks = 0;          // Slurm's --array=0-N%K; 0: no limit
  std::vector<std::pair<std::string, std::string>> environment;  // exported, in order
  int nodes = 1;
  int tasks_per_node = 1;
  // GPU jobs get the cluster's GPU, exclusive-node and memory requests; CPU jobs (data
  // preparation) do not, and ask for cpus_per_task CPUs instead (0: the scheduler's default).
  bool uses_gpus = true;
  int cpus_per_task = 0;
  // A CPU job that takes whole nodes as NeMo's Pile preprocessing does (its tasks use every
  // core): it gets the cluster's `exclusive` and `mem` requests, not the GPU ones.
  bool whole_node = false;
  // The tasks are ranks of one training job that meet one another (pretrain_gpt): Slurm's script
  // starts them under PMIx where srun has it, so they join MPI, and exports where GPU ranks meet
  // without it (MASTER_ADDR, MASTER_PORT: docs/parallelism.md).
  bool ranks_meet = false;
  std::string time_limit;              // Slurm's D-HH:MM:SS, may be empty
  std::string tool;                    // the backend executable's name, for "not built" messages
  // Scheduler dependencies: the id of the job this one runs after, set by the launcher from the
  // last job submitted, with how it waits (afterany, or afterok after a job whose successors
  // need its success), and <stage>.run.dependency (e.g. "singleton"), passed to Slurm as is.
  std::string after_job_id;
  std::string after_condition = "afterany";
  std::string run_dependency;
  // True for jobs whose output the next job needs (a download before its preprocessing, the
  // data before training): the next job then waits with afterok, not afterany.
  bool successors_need_success = false;

  bool is_array() const { return !array_tasks.empty(); }
  // The argv that names the job's tool (the first task's for an array).
  const std::vector<std::string>& program_command() const {
    return is_array() ? array_tasks.front() : command;
  }
};

}  // namespace launcher
