// The Slurm cluster (NeMo's "bcm"): an sbatch script whose #SBATCH header comes from the
// cluster config and the job, whose body exports the environment and runs the backend under
// srun (one task per GPU), submitted with sbatch; the job id is parsed from sbatch's
// "Submitted batch job N", and a job's state read from `scontrol show job`. Reference:
// NeMo-Megatron-Launcher nemo_launcher/core/launchers.py (SlurmLauncher) and Slurm's sbatch(1).
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <set>
#include <sstream>
#include <string_view>

#include "backend/common/ascii_case.hpp"
#include "backend/common/error.hpp"
#include "launcher/clusters/cluster.hpp"
#include "launcher/config/scalar_text.hpp"
#include "launcher/process.hpp"
#include "launcher/shell_quote.hpp"

namespace launcher {

namespace {

// pyxis's srun options (its SPANK plugin's --container-* and --no-container-*), with or
// without "=value".
bool is_pyxis_option(const std::string& argument) {
  return argument.starts_with("--container-") || argument.starts_with("--no-container-");
}

bool is_plain_directive_character(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || std::string_view("_@%+=:,./-").find(c) != std::string_view::npos;
}

// sbatch splits each #SBATCH line into arguments with its own parser (Slurm src/sbatch/opt.c,
// _get_argument): whitespace separates, '...' and "..." group, a backslash takes the next
// character literally, an unquoted '#' ends the line. So a value is written as is when it has
// only plain characters, else double-quoted with \ and \" escapes: one argument, exactly the
// value. Refused: control characters (one line per directive), and "hetjob"/"packjob", which
// sbatch reads on any #SBATCH line, quoted or not, as the start of another job component.
std::string directive(const std::string& option, const std::string& value) {
  const std::string name = "#SBATCH " + option;
  refuse_control_characters(name, value);
  const std::string lower = common::ascii_lowercase(value);
  if (lower.find("hetjob") != std::string::npos || lower.find("packjob") != std::string::npos) {
    common::fail("{}: the value {:?} holds \"hetjob\" or \"packjob\", which sbatch reads on any "
                 "#SBATCH line as the start of another component of a heterogeneous job", name, value);
  }
  if (!value.empty() && std::all_of(value.begin(), value.end(), is_plain_directive_character)) {
    return option + "=" + value;
  }
  std::string quoted = "\"";
  for (char c : value) {
    if (c == '\\' || c == '"') quoted += '\\';
    quoted += c;
  }
  return option + "=" + quoted + "\"";
}

// A bcm.yaml key the launcher does not know becomes the name of an #SBATCH option.
void check_option_key(const std::string& key) {
  auto is_alphanumeric = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0; };
  const bool valid = !key.empty() && is_alphanumeric(key.front()) &&
                     std::all_of(key.begin(), key.end(), [&](char c) {
                       return is_alphanumeric(c) || c == '_' || c == '-';
                     });
  if (!valid) {
    common::fail("cluster key {:?} is not one the launcher knows, so it would become an #SBATCH "
                 "option, and option names must match [A-Za-z0-9][A-Za-z0-9_-]* (e.g. qos, "
                 "mail_type)", key);
  }
}

std::string cluster_text(const Node& value, const std::string& key) {
  return launcher::scalar_text(value, "cluster." + key);
}

// Keys of cluster/bcm.yaml with their own meaning; any other key passes through as an
// #SBATCH option of the same name (underscores become dashes).
const std::set<std::string> kKnownKeys = {"partition", "account",   "exclusive",     "gpus_per_task",
                                          "gpus_per_node", "mem",   "job_name_prefix", "gres",
                                          "srun_args",     "stderr_to_stdout", "gpu_memory_gb"};

}  // namespace

std::string render_sbatch(const JobSpec& job, const std::filesystem::path& script_path,
                          const RenderContext& context) {
  const Node& cluster = *context.cluster;
  auto value_of = [&](const std::string& key) -> const Node* {
    const Node* value = find(cluster, key);
    return value == nullptr || value->is_null() ? nullptr : value;
  };
  std::vector<std::string> directives = {
      directive("--job-name", job.job_name),
      directive("--nodes", std::to_string(job.nodes)),
      directive("--ntasks-per-node", std::to_string(job.tasks_per_node)),
  };
  // CPU jobs (data preparation) leave out the node-sized requests of GPU training: no GPUs,
  // no exclusive node, no --mem=0 (all of a node's memory), so many tasks share a node.
  const std::set<std::string> kGpuJobOnly = {"gpus_per_task", "gpus_per_node", "gres", "mem", "exclusive"};
  const std::set<std::string> kWholeNode = {"mem", "exclusive"};  // JobSpec::whole_node keeps these
  for (const auto& [key, option] : std::vector<std::pair<std::string, std::string>>{
           {"partition", "--partition"}, {"account", "--account"}, {"gpus_per_task", "--gpus-per-task"},
           {"gpus_per_node", "--gpus-per-node"}, {"gres", "--gres"}, {"mem", "--mem"}}) {
    const bool whole_node_key = job.whole_node && kWholeNode.contains(key);
    if (!job.uses_gpus && kGpuJobOnly.contains(key) && !whole_node_key) continue;
    if (const Node* value = value_of(key)) directives.push_back(directive(option, cluster_text(*value, key)));
  }
  // Switches are true or false (null: false); anything else is refused, not read as false.
  auto switched_on = [&](const std::string& key) {
    const Node* value = value_of(key);
    return value != nullptr && value->as_bool("cluster." + key);
  };
  if (switched_on("exclusive") && (job.uses_gpus || job.whole_node)) {
    directives.push_back("--exclusive");
  }
  if (job.cpus_per_task > 0) directives.push_back(directive("--cpus-per-task", std::to_string(job.cpus_per_task)));
  if (job.is_array()) {
    std::string range = fmt::format("0-{}", job.array_tasks.size() - 1);
    if (job.max_parallel_tasks > 0) range += fmt::format("%{}", job.max_parallel_tasks);
    directives.push_back(directive("--array", range));
  }
  if (!job.time_limit.empty()) directives.push_back(directive("--time", job.time_limit));
  // Slurm ANDs comma-separated dependencies: after the previous job, and e.g. singleton.
  std::vector<std::string> dependencies;
  if (!job.after_job_id.empty()) dependencies.push_back(job.after_condition + ":" + job.after_job_id);
  if (!job.run_dependency.empty()) dependencies.push_back(job.run_dependency);
  if (!dependencies.empty()) {
    directives.push_back(directive("--dependency", fmt::format("{}", fmt::join(dependencies, ","))));
  }
  // A failed afterok dependency can never be satisfied: without this the job (and everything
  // after it) would stay PENDING (DependencyNeverSatisfied) until someone cancels it.
  if (!job.after_job_id.empty() && job.after_condition == "afterok") {
    directives.push_back("--kill-on-invalid-dep=yes");
  }
  // Array tasks each get their own log: %A is the array's job id, %a the task index.
  const auto log_stem = (job.results_dir / ("log-" + job.job_name + (job.is_array() ? "_%A_%a" : "_%j"))).string();
  directives.push_back(directive("--output", log_stem + ".out"));
  if (!switched_on("stderr_to_stdout")) {
    directives.push_back(directive("--error", log_stem + ".err"));
  }
  if (cluster.is_map()) {
    for (const auto& key : cluster.keys()) {
      if (kKnownKeys.contains(key)) continue;
      check_option_key(key);
      const Node* value = value_of(key);
      if (value == nullptr) continue;
      std::string option = "--" + key;
      std::replace(option.begin(), option.end(), '_', '-');
      // NeMo passes unknown keys through; say so once per key, since a typo lands here too.
      spdlog::warn("cluster.{} is not a bcm.yaml key the launcher knows: passing it to sbatch as "
                   "#SBATCH {}", key, option);
      directives.push_back(directive(option, cluster_text(*value, key)));
    }
  }

  // In the order NeMo's scripts have them (submitit writes its parameters sorted by name, with
  // underscores), so that a NeMo user's diff of the two headers shows only what differs.
  auto sort_key = [](const std::string& line) {
    std::string name = line.substr(0, line.find('='));
    std::replace(name.begin(), name.end(), '-', '_');
    return name;
  };
  std::stable_sort(directives.begin(), directives.end(),
                   [&](const std::string& a, const std::string& b) { return sort_key(a) < sort_key(b); });

  std::vector<std::string> srun_arguments;
  // A container image runs the job through pyxis/enroot, as NeMo's launcher does; without one
  // the job runs on bare metal. Spelled as NeMo spells them (option and value as two words).
  if (!context.container_image.empty()) {
    srun_arguments.push_back("--container-image");
    srun_arguments.push_back(context.container_image);
    if (!context.container_mounts.empty()) {
      std::string mounts;
      for (const auto& mount : context.container_mounts) {
        // pyxis splits --container-mounts at commas and has no escape for one.
        if (mount.find(',') != std::string::npos) {
          common::fail("container mount {:?} holds a comma, which pyxis's --container-mounts reads as "
                       "the start of another mount (it has no escape): rename the directory or mount "
                       "one without a comma (the mounts are config container_mounts, "
                       "launcher_scripts_path, data_dir and base_results_dir)", mount);
        }
        mounts += (mounts.empty() ? "" : ",") + (mount.find(':') == std::string::npos ? mount + ":" + mount : mount);
      }
      srun_arguments.push_back("--container-mounts");
      srun_arguments.push_back(mounts);
    }
    srun_arguments.push_back("--no-container-mount-home");
  }
  if (const Node* extra = value_of("srun_args"); extra && extra->is_list()) {
    for (size_t i = 0; i < extra->size(); ++i) {
      std::string argument = cluster_text(extra->at(i), fmt::format("srun_args.{}", i));
      // NeMo's bcm.yaml lists --no-container-mount-home in srun_args; with a container it is
      // already there, and twice would only make the line differ from NeMo's.
      if (argument == "--no-container-mount-home" && !context.container_image.empty()) continue;
      // Without a container pyxis's options say nothing, and an srun without pyxis refuses
      // them ("unrecognized option"): NeMo's bcm.yaml would stop every bare-metal job step.
      // (note_pyxis_options_unused says so, once per launch.)
      if (context.container_image.empty() && is_pyxis_option(argument)) continue;
      srun_arguments.push_back(std::move(argument));
    }
  }

  TemplateData data = common_template_data(job, script_path);
  // Ranks of one training job meet: through MPI where srun has PMIx and cluster.srun_args does
  // not choose an --mpi plugin itself, else (GPU ranks) at MASTER_ADDR:MASTER_PORT, unless
  // env_vars set them.
  const bool several_ranks =
      job.ranks_meet && job.nodes * job.tasks_per_node > 1 && !job.is_array();
  const bool chooses_mpi =
      std::any_of(srun_arguments.begin(), srun_arguments.end(), [](const std::string& argument) {
        return argument == "--mpi" || argument.starts_with("--mpi=");
      });
  const bool sets_rendezvous =
      std::any_of(job.environment.begin(), job.environment.end(), [](const auto& variable) {
        return variable.first == "MASTER_ADDR" || variable.first == "MASTER_PORT";
      });
  data.set("pmix_probe", several_ranks && !chooses_mpi);
  data.set("rendezvous", several_ranks && !sets_rendezvous);
  TemplateData directive_list{TemplateData::type::list};
  for (const auto& line : directives) directive_list.push_back(TemplateData(line));
  data.set("directives", directive_list);
  // With its space after it: an srun without extra arguments is `srun <command>`.
  data.set("srun_arguments",
           srun_arguments.empty() ? std::string() : shell_join(srun_arguments) + " ");
  // With a container the backend is in the image (container/README.md: backend_bin_dir is the
  // image's path), so the script's check for it on the batch node would stop every job.
  data.set("in_container", !context.container_image.empty());
  return render_template(context.templates_dir, "bcm.sbatch.mustache", data);
}

namespace {

// Without a container, render_sbatch leaves pyxis's options (--container-*, --no-container-*)
// out of cluster.srun_args; this logs which, once per launch.
void note_pyxis_options_unused(const Node& cluster, const std::string& container_image) {
  const Node* extra = cluster.is_map() ? find(cluster, "srun_args") : nullptr;
  if (!container_image.empty() || extra == nullptr || !extra->is_list()) return;
  for (size_t i = 0; i < extra->size(); ++i) {
    if (!extra->at(i).is_string() || !is_pyxis_option(extra->at(i).as_string())) continue;
    spdlog::info("cluster.srun_args.{}: {} is pyxis's and there is no container (config `container` "
                 "is null): not passed to srun", i, extra->at(i).as_string());
  }
}

// Before a Slurm submission with a container image: when srun is on PATH and its help does not
// list pyxis's --container-image, a common::Error naming `container` and what to set instead.
// Without srun here nothing can be told, and nothing is said.
void check_srun_runs_containers(const std::string& container_image) {
  if (container_image.empty() || !find_on_path("srun")) return;
  // pyxis is a SPANK plugin: when plugstack.conf loads it, srun's help lists its options.
  const CapturedRun help = run_and_capture({"srun", "--help"});
  if (help.exit_code != 0 || help.output.find("--container-image") != std::string::npos) return;
  common::fail("container is {:?}, but this cluster's srun has no pyxis plugin (`srun --help` lists "
               "no --container-image), so srun would refuse the job step: set container=null to run "
               "the backend on the nodes directly (it needs no container; with a NeMo conf tree, "
               "whose container is NeMo's image, this is the setting to use), or install pyxis",
               container_image);
}

// Config `container` as launch_main reads it: null is none (bare metal), and anything but a
// string is refused.
std::string configured_container_image(const Node& config) {
  const Node* value = find(config, "container");
  if (value == nullptr || value->is_null()) return {};
  if (!value->is_string()) common::fail("container: expected a string");
  return value->as_string();
}

Submission submit_sbatch(const JobSpec& job, const std::filesystem::path& script_path) {
  const CapturedRun run = run_and_capture({"sbatch", script_path.string()});
  // sbatch prints "Submitted batch job <id>" (or "<id>;<cluster>" with --parsable).
  constexpr std::string_view kSubmitted = "Submitted batch job ";
  const size_t at = run.output.find(kSubmitted);
  std::string job_id;
  if (at != std::string::npos) {
    for (size_t i = at + kSubmitted.size(); i < run.output.size() && std::isdigit(
             static_cast<unsigned char>(run.output[i])); ++i) {
      job_id += run.output[i];
    }
  }
  if (run.exit_code != 0 || job_id.empty()) {
    common::fail("sbatch {} failed (exit {}): {}", script_path.string(), run.exit_code, run.output);
  }
  Submission submission;
  submission.job_id = job_id;
  // For an array, the log of task 0 (each task has its own: log-<job>_<id>_<task>.out).
  submission.log_file = job.results_dir / (job.is_array()
      ? fmt::format("log-{}_{}_0.out", job.job_name, submission.job_id)
      : fmt::format("log-{}_{}.out", job.job_name, submission.job_id));
  return submission;
}

class SlurmCluster final : public Cluster {
 public:
  std::string_view name() const override { return "bcm"; }
  std::string_view script_suffix() const override { return "_submission.sh"; }

  void check_launch(const std::vector<JobSpec>& /*jobs*/, const Node& config, const Node& cluster,
                    bool dry_run) const override {
    const std::string image = configured_container_image(config);
    // A dry run asks nothing of the cluster (it runs neither sbatch nor srun).
    if (!dry_run) check_srun_runs_containers(image);
    note_pyxis_options_unused(cluster, image);
  }

  std::string render(const JobSpec& job, const std::filesystem::path& script_path,
                     const RenderContext& context) const override {
    return render_sbatch(job, script_path, context);
  }

  Submission submit(const JobSpec& job, const std::filesystem::path& script_path,
                    const SubmitContext& context) const override {
    return announce_queued(submit_sbatch(job, script_path), context);
  }

  bool chains_jobs() const override { return true; }

  std::string job_state(const JobRecord& record) const override {
    const auto run = run_if_on_path({"scontrol", "show", "job", "-o", record.job_id});
    if (!run) return "unknown (no scontrol on PATH)";
    // One line per job; a job array gives one per task (or per pending range of tasks), and
    // its state is each distinct task state with how many tasks are in it.
    std::map<std::string, int> counts;  // sorted: the summary does not depend on scontrol's order
    std::istringstream lines(run->output);
    for (std::string line; std::getline(lines, line);) {
      const std::string state = scheduler_field(line, "JobState=");
      if (state.empty()) continue;
      const std::string exit_code = scheduler_field(line, "ExitCode=");
      const std::string shown =
          exit_code.empty() || exit_code == "0:0" ? state : state + " (exit " + exit_code + ")";
      ++counts[shown];
    }
    if (run->exit_code != 0 || counts.empty()) return "unknown (" + first_output_line(run->output) + ")";
    if (counts.size() == 1 && counts.begin()->second == 1) return counts.begin()->first;
    std::string summary;
    for (const auto& [state, count] : counts) {
      summary += fmt::format("{}{} ×{}", summary.empty() ? "" : ", ", state, count);
    }
    return summary;
  }

  CandidateEnd autoconfig_candidate_end() const override { return CandidateEnd::kFinalJobState; }
};

}  // namespace

std::unique_ptr<Cluster> make_slurm_cluster() { return std::make_unique<SlurmCluster>(); }

}  // namespace launcher
