// Cluster back ends: each renders a JobSpec into a script from its template and submits it.
//   local  (local_cluster.cpp): a bash script run in the foreground, output teed to the log
//   bcm    (slurm_cluster.cpp): an sbatch script submitted with sbatch
// PBS and Kubernetes come with the launcher issue; choosing them fails with that message.
#pragma once

#include <filesystem>
#include <ostream>
#include <string>

#include "launcher/clusters/script_template.hpp"
#include "launcher/config/node.hpp"
#include "launcher/stages/job.hpp"

namespace launcher {

struct RenderContext {
  std::filesystem::path templates_dir;
  const Node* cluster = nullptr;  // the resolved `cluster` section
};

struct Submission {
  std::string job_id;  // Slurm job id, or the local process id
  int exit_code = 0;   // local jobs: the script's exit status; queued jobs: 0
  std::filesystem::path log_file;
};

// The data every template shares: version, stage, run name, results dir, environment, command.
TemplateData common_template_data(const JobSpec& job, const std::filesystem::path& script_path);

std::string render_local_script(const JobSpec& job, const std::filesystem::path& script_path,
                                const RenderContext& context);
Submission run_local_script(const JobSpec& job, const std::filesystem::path& script_path,
                            std::ostream& terminal);

std::string render_sbatch(const JobSpec& job, const std::filesystem::path& script_path,
                          const RenderContext& context);
Submission submit_sbatch(const JobSpec& job, const std::filesystem::path& script_path);

}  // namespace launcher
