// Cluster back ends: each renders a JobSpec into a script from its template, submits it and
// tells a submitted job's state. `Cluster` is what the rest of the launcher sees of one, chosen
// once from cluster_type by make_cluster, so that no code outside clusters/ asks which it is.
//   local  (local_cluster.cpp, LocalCluster):      a bash script run in the foreground (or
//          detached), output teed to the log
//   bcm    (slurm_cluster.cpp, SlurmCluster):      an sbatch script submitted with sbatch
//   pbs    (pbs_cluster.cpp, PbsCluster):          a PBS Pro script with mpiexec, submitted with qsub
//   k8s    (k8s_cluster.cpp, KubernetesCluster):   a Kubeflow PyTorchJob manifest, applied with kubectl
#pragma once

#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "launcher/clusters/script_template.hpp"
#include "launcher/config/node.hpp"
#include "launcher/process.hpp"
#include "launcher/run_status.hpp"
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

// What a submission needs besides the job and its script.
struct SubmitContext {
  const Node* cluster = nullptr;  // the resolved `cluster` section (local: detach)
  std::string label;              // the stage (stage.step) as the launcher's log lines name it
  std::ostream* terminal = nullptr;  // a foreground local job's output goes here too
  std::optional<std::chrono::milliseconds> time_limit;  // a foreground local job is stopped past it
  // Called just before a job that outlives the launcher starts on this machine (a detached local
  // job), so that the launcher can hand it the results directory's lock.
  std::function<void()> before_detached_start;
};

struct Submission {
  // The scheduler's job id, the local process id or the PyTorchJob's name; empty when the
  // script was written but not submitted (no kubectl): then there is nothing to track.
  std::string job_id;
  // Set only for a job that ran to its end in the foreground (local): its exit status.
  std::optional<int> exit_code;
  bool timed_out = false;  // local jobs: stopped at their time limit
  int interrupted_by = 0;  // local jobs with a time limit: the stop signal passed on to them
  std::filesystem::path log_file;
};

// How autoconfig learns that a candidate's benchmark job has ended.
enum class CandidateEnd {
  kUnsupported,    // it cannot wait for one here: autoconfig refuses the cluster
  kLaunchReturns,  // the launch runs the job to its end (or its time limit) before it returns
  kFinalJobState,  // the job is queued; job_state turns to one of Slurm's final states
};

// One back end, as launch_main, `launcher status` and autoconfig use it.
class Cluster {
 public:
  virtual ~Cluster() = default;

  // Its cluster_type (local, bcm, pbs, k8s), as job records and messages name it.
  virtual std::string_view name() const = 0;
  // What follows the job name in the job script's file name: _submission.sh, or
  // _submission.yaml for a Kubernetes manifest.
  virtual std::string_view script_suffix() const = 0;

  // Once per launch, before anything is written or queued: refuses what this cluster cannot run
  // (several jobs of a detached local launch, job arrays on PBS and Kubernetes) or what its own
  // tools would refuse (Slurm: a container without pyxis), and says what of its section goes
  // unused. `config` is the whole resolved config, `cluster` its `cluster` section; a dry run
  // asks nothing of the cluster.
  virtual void check_launch(const std::vector<JobSpec>& jobs, const Node& config,
                            const Node& cluster, bool dry_run) const = 0;

  virtual std::string render(const JobSpec& job, const std::filesystem::path& script_path,
                             const RenderContext& context) const = 0;
  // Submits (queues, applies or runs) a written script and says so in the log.
  virtual Submission submit(const JobSpec& job, const std::filesystem::path& script_path,
                            const SubmitContext& context) const = 0;
  // Whether a submitted job's id becomes the next job's after_job_id (scheduler dependencies, or
  // local jobs run in turn); Kubernetes PyTorchJobs have no dependencies.
  virtual bool chains_jobs() const = 0;

  // The scheduler's word for a recorded job (see query_job_state).
  virtual std::string job_state(const JobRecord& record) const = 0;
  virtual CandidateEnd autoconfig_candidate_end() const = 0;
};

// The back end of this cluster_type, or nullptr when none has that name (auto and NeMo's
// interactive are resolved before: resolve_cluster_type).
std::unique_ptr<Cluster> find_cluster(std::string_view cluster_type);
// find_cluster's back end; an unknown name is a common::Error listing the valid cluster_types.
std::unique_ptr<Cluster> make_cluster(std::string_view cluster_type);

// Each back end from its own file; find_cluster asks each for its name.
std::unique_ptr<Cluster> make_local_cluster();
std::unique_ptr<Cluster> make_slurm_cluster();
std::unique_ptr<Cluster> make_pbs_cluster();
std::unique_ptr<Cluster> make_kubernetes_cluster();

// Shared by the back ends (cluster.cpp).
// A job array refused where cluster_type has none (Kubernetes) or renders none yet (PBS).
void refuse_job_arrays(const std::vector<JobSpec>& jobs, std::string_view cluster_type);
// The value after "key" in scheduler output such as "JobState=RUNNING Reason=None" or
// "job_state = R", up to the next whitespace; empty when key is not there.
std::string scheduler_field(const std::string& text, const std::string& key);
// The first line of a tool's output, without trailing whitespace.
std::string first_output_line(const std::string& text);
// Runs a scheduler's query tool; nullopt when it is not on PATH.
std::optional<CapturedRun> run_if_on_path(const std::vector<std::string>& argv);
// A batch scheduler's submission in the log: the scheduler's own words ("Submitted batch job
// N", as sbatch prints them) and where the job's output goes. Returns `submission`.
Submission announce_queued(Submission submission, const SubmitContext& context);

// The data every template shares: version, stage, run name, results dir, environment, command.
TemplateData common_template_data(const JobSpec& job, const std::filesystem::path& script_path);

// Refuses a job whose program path starts with '-' (srun, mpirun, mpiexec and exec would read
// it as an option), naming backend_bin_dir. Paths the scripts pass to mkdir, cd and
// `command -v` follow a `--` instead, so a results directory may start with '-'.
void check_program(const JobSpec& job);

// Each back end's render(), also called directly by the tests.
std::string render_local_script(const JobSpec& job, const std::filesystem::path& script_path,
                                const RenderContext& context);
std::string render_sbatch(const JobSpec& job, const std::filesystem::path& script_path,
                          const RenderContext& context);
std::string render_pbs(const JobSpec& job, const std::filesystem::path& script_path,
                       const RenderContext& context);

// Slurm time limits (minutes, M:S, H:M:S, D-H, D-H:M, D-H:M:S) as PBS walltime H:MM:SS. A
// limit in none of these forms, or too long to count in seconds, is a common::Error naming
// `key` (where the limit came from, e.g. training.run.time_limit).
std::string pbs_walltime(const std::string& slurm_time_limit, std::string_view key);

std::string render_pytorchjob(const JobSpec& job, const std::filesystem::path& manifest_path,
                              const RenderContext& context);

// A Kubernetes object name (RFC 1123 label: lowercase alphanumerics and '-', at most 63,
// starting and ending alphanumeric) made from a job name.
std::string kubernetes_name(const std::string& job_name);

}  // namespace launcher
