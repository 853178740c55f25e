// The local cluster: render a bash script and run it in the foreground, streaming its output
// to the terminal and to results/<run>/log-<job name>_<pid>.out, as NeMo's interactive mode (or,
// with cluster.detach=true, start it in the background). Also the template data every script
// cluster shares.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <sstream>
#include <vector>

#include "backend/common/error.hpp"
#include "backend/common/small_file.hpp"
#include "launcher/clusters/cluster.hpp"
#include "launcher/process.hpp"
#include "launcher/shell_quote.hpp"

namespace launcher {

void check_program(const JobSpec& job) {
  std::vector<const std::vector<std::string>*> commands = {&job.command};
  for (const auto& task : job.array_tasks) commands.push_back(&task);
  for (const auto* command : commands) {
    if (command->empty() || !command->front().starts_with('-')) continue;
    common::fail("the {} program {:?} starts with '-', which srun, mpirun and mpiexec would read as "
                 "an option of their own: set backend_bin_dir to an absolute path", job.stage,
                 command->front());
  }
}

TemplateData common_template_data(const JobSpec& job, const std::filesystem::path& script_path) {
  check_program(job);
  TemplateData data;
  // The header comment names the run too: quoted like any value, it stays on its line.
  data.set("version", shell_quote(PROJECT_VERSION_STRING));
  data.set("stage", shell_quote(job.stage));
  data.set("run_name", shell_quote(job.run_name));
  data.set("script_path", shell_quote(script_path.string()));
  data.set("results_dir", shell_quote(job.results_dir.string()));
  TemplateData environment{TemplateData::type::list};
  for (const auto& [name, value] : job.environment) {
    // `export NAME=value`: the name is code, so it must be an identifier (env_vars are checked
    // when the config is read; checked again where the name becomes code).
    if (!is_shell_identifier(name)) {
      common::fail("env_vars.{}: not a valid environment variable name ([A-Za-z_][A-Za-z0-9_]*)", name);
    }
    TemplateData entry;
    entry.set("name", name);
    entry.set("value", shell_quote(value));
    environment.push_back(entry);
  }
  data.set("environment", environment);
  // One argument per line keeps long Megatron command lines readable and diffable.
  auto command_text = [](const std::vector<std::string>& argv, const std::string& indent) {
    std::string text = shell_quote(argv.front());
    for (size_t i = 1; i < argv.size(); ++i) {
      const bool is_flag = argv[i].starts_with("--");
      text += (is_flag ? " \\\n" + indent : " ") + shell_quote(argv[i]);
    }
    return text;
  };
  const std::vector<std::string>& program = job.program_command();
  if (job.is_array()) {
    // A job array: the script dispatches on the task index (templates: `case`).
    TemplateData array;
    TemplateData tasks{TemplateData::type::list};
    for (size_t i = 0; i < job.array_tasks.size(); ++i) {
      TemplateData task;
      task.set("index", std::to_string(i));
      task.set("command", command_text(job.array_tasks[i], "        "));
      tasks.push_back(task);
    }
    array.set("tasks", tasks);
    array.set("count", std::to_string(job.array_tasks.size()));
    array.set("last", std::to_string(job.array_tasks.size() - 1));
    data.set("array", array);
  } else {
    data.set("single", true);
    data.set("command", command_text(job.command, "    "));
  }
  data.set("program", shell_quote(program.front()));
  const std::string tool = job.tool.empty() ? program.front() : job.tool;
  data.set("missing_tool_message",
           shell_quote(fmt::format("launcher: the {} stage needs {}, which is not at {}: it is not "
                                   "built yet in this version, or backend_bin_dir points elsewhere",
                                   job.stage, tool, program.front())));
  return data;
}

std::string render_local_script(const JobSpec& job, const std::filesystem::path& script_path,
                                const RenderContext& context) {
  if (job.nodes > 1) {
    common::fail("{}: the local cluster is this one machine, but trainer.num_nodes = {}: set "
                 "training.trainer.num_nodes=1, or use a scheduler (cluster_type=bcm|pbs|k8s)",
                 job.stage, job.nodes);
  }
  TemplateData data = common_template_data(job, script_path);
  if (job.tasks_per_node > 1) {
    TemplateData mpirun;
    mpirun.set("ranks", std::to_string(job.tasks_per_node));
    data.set("mpirun", mpirun);
  }
  return render_template(context.templates_dir, "local.sh.mustache", data);
}

namespace {

// With a time limit, the job is stopped when it runs past it (see run_and_tee).
Submission run_local_script(const JobSpec& job, const std::filesystem::path& script_path,
                            std::ostream& terminal,
                            std::optional<std::chrono::milliseconds> time_limit) {
  Submission submission;
  const TeedRun run = run_and_tee(
      {"bash", script_path.string()},
      [&](int pid) {
        submission.job_id = std::to_string(pid);
        submission.log_file = job.results_dir / fmt::format("log-{}_{}.out", job.job_name, pid);
        return submission.log_file;
      },
      terminal, time_limit);
  submission.exit_code = run.exit_code;
  submission.timed_out = run.timed_out;
  submission.interrupted_by = run.interrupted_by;
  return submission;
}

// A detached job writes its exit status here when it ends (start_local_script), which is how
// `launcher status` knows it has.
std::filesystem::path local_exit_status_file(const std::filesystem::path& results_dir,
                                             const std::string& job_id) {
  return results_dir / fmt::format(".job-{}.exit", job_id);
}

// cluster.detach=true: starts the script in its own session and returns at once. The job
// writes its output to log-<job>_<pid>.out and its exit status to local_exit_status_file.
Submission start_local_script(const JobSpec& job, const std::filesystem::path& script_path) {
  // bash's $$ is the detached process's pid (setsid execs it directly), which names the log and
  // the exit-status file; the paths reach bash as arguments, never as code.
  const std::string wrapper =
      "exec >\"$1/log-$2_$$.out\" 2>&1; bash \"$0\"; echo $? >\"$1/.job-$$.exit\"";
  Submission submission;
  const int pid = start_detached(
      {"bash", "-c", wrapper, script_path.string(), job.results_dir.string(), job.job_name});
  submission.job_id = std::to_string(pid);
  submission.log_file = job.results_dir / fmt::format("log-{}_{}.out", job.job_name, pid);
  return submission;
}

bool local_detach(const Node& cluster) {
  const Node* detach = find(cluster, "detach");
  return detach != nullptr && !detach->is_null() && detach->as_bool("cluster.detach");
}

class LocalCluster final : public Cluster {
 public:
  std::string_view name() const override { return "local"; }
  std::string_view script_suffix() const override { return "_submission.sh"; }

  // A detached local launch runs one job: later ones would not wait for it.
  void check_launch(const std::vector<JobSpec>& jobs, const Node& /*config*/, const Node& cluster,
                    bool /*dry_run*/) const override {
    if (!local_detach(cluster) || jobs.size() <= 1) return;
    std::string names;
    for (const JobSpec& job : jobs) names += (names.empty() ? "" : ", ") + job.job_name;
    common::fail("cluster.detach=true runs one job in the background, but this launch has {} "
                 "({}), and the later ones would not wait for it: launch them one at a time, or "
                 "without cluster.detach", jobs.size(), names);
  }

  std::string render(const JobSpec& job, const std::filesystem::path& script_path,
                     const RenderContext& context) const override {
    return render_local_script(job, script_path, context);
  }

  Submission submit(const JobSpec& job, const std::filesystem::path& script_path,
                    const SubmitContext& context) const override {
    if (local_detach(*context.cluster)) {
      // The job outlives this launcher: it keeps the results directory taken while it runs.
      if (context.before_detached_start) context.before_detached_start();
      Submission submission = start_local_script(job, script_path);
      spdlog::info("{}: local job {} runs in the background; output in {}", context.label,
                   submission.job_id, submission.log_file.string());
      return submission;
    }
    // Local jobs run one after the other, each to its end (or its time limit).
    Submission submission = run_local_script(job, script_path, *context.terminal, context.time_limit);
    if (submission.timed_out) {
      spdlog::warn("{}: local job {} ran past its time limit of {} s and was stopped", context.label,
                   submission.job_id, context.time_limit->count() / 1000.0);
    }
    spdlog::info("{}: local job {} exited with status {}; output in {}", context.label,
                 submission.job_id, *submission.exit_code, submission.log_file.string());
    return submission;
  }

  bool chains_jobs() const override { return true; }

  // The recorded exit status: of a foreground job in its record, of a detached one in the file
  // it writes when it ends.
  std::string job_state(const JobRecord& record) const override {
    std::optional<int> exit_code = record.exit_code;
    if (!exit_code) {
      std::istringstream status_file(
          common::read_small_file_if_exists(
              local_exit_status_file(record.script.parent_path(), record.job_id),
              "the job's exit status")
              .value_or(""));
      int status = 0;
      if (status_file >> status) {
        exit_code = status;
      } else {
        std::error_code error;
        return std::filesystem::exists("/proc/" + record.job_id, error)
                   ? "RUNNING"
                   : "unknown (no exit status recorded)";
      }
    }
    // Slurm's word for a job ended at its time limit.
    if (record.timed_out) return "TIMEOUT";
    return *exit_code == 0 ? "COMPLETED" : fmt::format("FAILED (exit {})", *exit_code);
  }

  CandidateEnd autoconfig_candidate_end() const override { return CandidateEnd::kLaunchReturns; }
};

}  // namespace

std::unique_ptr<Cluster> make_local_cluster() { return std::make_unique<LocalCluster>(); }

}  // namespace launcher
