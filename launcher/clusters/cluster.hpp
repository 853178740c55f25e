// Cluster back ends: each renders a JobSpec into a script from its template and submits it.
//   local  (local_cluster.cpp): a bash script run in the foreground, output teed to the log
//   bcm    (slurm_cluster.cpp): an sbatch script submitted with sbatch
//   pbs    (pbs_cluster.cpp):   a PBS Pro script with mpiexec, submitted with qsub
//   k8s    (k8s_cluster.cpp):   a Kubeflow PyTorchJob manifest, applied with kubectl
#pragma once

#include <chrono>
#include <filesystem>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>

#include "launcher/clusters/script_template.hpp"
#include "launcher/config/node.hpp"
#include "launcher/stages/job.hpp"

namespace launcher {

struct RenderContext {
  std::filesystem::path templates_dir;
  const Node* cluster = nullptr;  // the resolved `cluster` section
  std::string container_image;    // config `container`; empty: bare metal
  // Paths the container sees at the same place (pyxis --container-mounts src:dst): the
  // launcher's directories and config `container_mounts`.
  std::vector<std::string> container_mounts;
};

struct Submission {
  std::string job_id;  // Slurm job id, or the local process id
  int exit_code = 0;   // local jobs: the script's exit status; queued jobs: 0
  bool timed_out = false;  // local jobs: stopped at their time limit
  int interrupted_by = 0;  // local jobs with a time limit: the stop signal passed on to them
  std::filesystem::path log_file;
};

// The data every template shares: version, stage, run name, results dir, environment, command.
TemplateData common_template_data(const JobSpec& job, const std::filesystem::path& script_path);

// Refuses a job whose program path starts with '-' (srun, mpirun, mpiexec and exec would read
// it as an option), naming backend_bin_dir. Paths the scripts pass to mkdir, cd and
// `command -v` follow a `--` instead, so a results directory may start with '-'.
void check_program(const JobSpec& job);

std::string render_local_script(const JobSpec& job, const std::filesystem::path& script_path,
                                const RenderContext& context);
// With a time limit, the job is stopped when it runs past it (see run_and_tee).
Submission run_local_script(const JobSpec& job, const std::filesystem::path& script_path,
                            std::ostream& terminal,
                            std::optional<std::chrono::milliseconds> time_limit = std::nullopt);
// cluster.detach=true: starts the script in its own session and returns at once. The job
// writes its output to log-<job>_<pid>.out and its exit status to the file below.
Submission start_local_script(const JobSpec& job, const std::filesystem::path& script_path);
std::filesystem::path local_exit_status_file(const std::filesystem::path& results_dir,
                                             const std::string& job_id);

std::string render_sbatch(const JobSpec& job, const std::filesystem::path& script_path,
                          const RenderContext& context);
Submission submit_sbatch(const JobSpec& job, const std::filesystem::path& script_path);
// Before a Slurm submission with a container image: when srun is on PATH and its help does not
// list pyxis's --container-image, a common::Error naming `container` and what to set instead.
// Without srun here nothing can be told, and nothing is said.
void check_srun_runs_containers(const std::string& container_image);
// Without a container, render_sbatch leaves pyxis's options (--container-*, --no-container-*)
// out of cluster.srun_args; this logs which, once per launch.
void note_pyxis_options_unused(const Node& cluster, const std::string& container_image);

std::string render_pbs(const JobSpec& job, const std::filesystem::path& script_path,
                       const RenderContext& context);
Submission submit_qsub(const JobSpec& job, const std::filesystem::path& script_path);

// Slurm time limits (minutes, M:S, H:M:S, D-H, D-H:M, D-H:M:S) as PBS walltime H:MM:SS. A
// limit in none of these forms, or too long to count in seconds, is a common::Error naming
// `key` (where the limit came from, e.g. training.run.time_limit).
std::string pbs_walltime(const std::string& slurm_time_limit, std::string_view key);

std::string render_pytorchjob(const JobSpec& job, const std::filesystem::path& manifest_path,
                              const RenderContext& context);
// kubectl apply -f manifest when kubectl is on PATH; otherwise says how to apply it and
// returns an empty job id.
Submission apply_pytorchjob(const JobSpec& job, const std::filesystem::path& manifest_path);

// A Kubernetes object name (RFC 1123 label: lowercase alphanumerics and '-', at most 63,
// starting and ending alphanumeric) made from a job name.
std::string kubernetes_name(const std::string& job_name);

}  // namespace launcher
