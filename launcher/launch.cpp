// `launcher main`; see launch.hpp. Results layout as NeMo-Megatron-Launcher writes it:
//   <base_results_dir>/<run.name>/<run.name>_hydra.yaml     the stage's own section, resolved
//                                 <run.name>_launcher_config.yaml   the whole resolved config
//                                 launcher_cmd.log          the command line, verbatim
//                                 launcher.log              this launcher's log
//                                 <prefix><run.name>_submission.sh
//                                 log-<prefix><run.name>_<job id>.out
#include "launcher/launch.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <ctime>
#include <map>
#include <optional>
#include <set>

#include "backend/common/durable_file.hpp"
#include "backend/common/error.hpp"
#include "backend/common/local_time.hpp"
#include "backend/common/logging.hpp"
#include "launcher/clusters/cluster.hpp"
#include "launcher/config/compose.hpp"
#include "launcher/config/interpolate.hpp"
#include "launcher/config/launcher_scripts_path.hpp"
#include "launcher/config/node.hpp"
#include "launcher/config/scalar_text.hpp"
#include "launcher/config/yaml_io.hpp"
#include "launcher/process.hpp"
#include "launcher/results_dir.hpp"
#include "launcher/run_status.hpp"
#include "launcher/shell_quote.hpp"
#include "launcher/stages/data_preparation_stage.hpp"
#include "launcher/stages/stage.hpp"
#include "launcher/stages/training_keys.hpp"
#include "launcher/stages/training_preflight.hpp"

namespace launcher {

namespace fs = std::filesystem;

namespace {

fs::path executable_dir() {
  std::error_code error;
  const fs::path self = fs::read_symlink("/proc/self/exe", error);
  return error ? fs::current_path() : self.parent_path();
}

// share/megatron_native of an installed launcher: conf/ and templates/ (CMakeLists.txt's
// install rules; LAUNCHER_INSTALLED_DATA_DIR is the path from bin/ to it).
fs::path installed_data_dir() {
  return executable_dir() / LAUNCHER_INSTALLED_DATA_DIR;
}

// What an override targets, without its +, ++ or ~ prefix: "cluster=bcm", "cluster.gres=null".
std::string_view override_target(std::string_view override_text) {
  while (!override_text.empty() && (override_text.front() == '+' || override_text.front() == '~')) {
    override_text.remove_prefix(1);
  }
  return override_text;
}

bool user_chose_group(const std::vector<std::string>& overrides, const std::string& group) {
  for (const auto& override_text : overrides) {
    const std::string_view target = override_target(override_text);
    if (target.starts_with(group + "=") || target.starts_with(group + "@")) return true;
  }
  return false;
}

std::string text_at(const Node& config, const std::string& key) {
  const Node* value = find(config, key);
  if (value == nullptr || value->is_null()) return {};
  if (!value->is_string()) common::fail("{}: expected a string", key);
  return value->as_string();
}

// env_vars: {NAME: value}; null values are dropped, names must be shell identifiers.
std::vector<std::pair<std::string, std::string>> job_environment(const Node& config) {
  std::vector<std::pair<std::string, std::string>> environment;
  const Node* vars = find(config, "env_vars");
  if (vars == nullptr || vars->is_null()) return environment;
  if (!vars->is_map()) common::fail("env_vars must be a mapping of NAME: value");
  for (const auto& name : vars->keys()) {
    const Node& value = vars->at(name);
    if (value.is_null()) continue;
    if (!is_shell_identifier(name)) {
      common::fail("env_vars.{}: not a valid environment variable name", name);
    }
    if (value.is_map() || value.is_list()) common::fail("env_vars.{}: expected a scalar", name);
    // As text the way a command line shows it (4, 0.5, true): to_yaml ended it in a newline,
    // which reached the script inside the quotes (OMP_NUM_THREADS='4⏎').
    environment.emplace_back(name, scalar_text(value, "env_vars." + name));
  }
  return environment;
}

// UNIQUE_OUTPUT_DIR=1 in the environment, or unique_output_dir: true in the config.
bool wants_unique_output_dir(const Node& config) {
  if (const char* variable = std::getenv("UNIQUE_OUTPUT_DIR")) {
    const std::string value = variable;
    if (value == "1" || value == "true" || value == "True") return true;
    if (!value.empty() && value != "0" && value != "false" && value != "False") {
      common::fail("UNIQUE_OUTPUT_DIR={}: expected 1 or 0", value);
    }
  }
  const Node* flag = find(config, "unique_output_dir");
  return flag != nullptr && !flag->is_null() && flag->as_bool("unique_output_dir");
}

// One timestamp per process, so the jobs of one multirun land under the same directory.
const std::string& launch_timestamp() {
  static const std::string stamp = common::format_local_time(std::time(nullptr), "%Y-%m-%d_%H-%M-%S");
  return stamp;
}

// The launcher's own directories and config `container_mounts` (null entries dropped), each
// mounted at the same path inside a container.
std::vector<std::string> container_mounts(const Node& config) {
  std::vector<std::string> mounts;
  for (const char* key : {"launcher_scripts_path", "data_dir", "base_results_dir"}) {
    const std::string path = text_at(config, key);
    if (!path.empty() && std::find(mounts.begin(), mounts.end(), path) == mounts.end()) {
      mounts.push_back(path);
    }
  }
  const Node* extra = find(config, "container_mounts");
  if (extra != nullptr && extra->is_list()) {
    for (size_t i = 0; i < extra->size(); ++i) {
      if (extra->at(i).is_null()) continue;
      mounts.push_back(extra->at(i).as_string(fmt::format("container_mounts.{}", i)));
    }
  } else if (extra != nullptr && !extra->is_null()) {
    common::fail("container_mounts must be a list of paths (src or src:dst)");
  }
  return mounts;
}

// Raises the log level to errors for its lifetime.
class QuietLog {
 public:
  QuietLog() : level_(spdlog::default_logger()->level()) {
    spdlog::default_logger()->set_level(spdlog::level::err);
  }
  ~QuietLog() { spdlog::default_logger()->set_level(level_); }
  QuietLog(const QuietLog&) = delete;
  QuietLog& operator=(const QuietLog&) = delete;

 private:
  spdlog::level::level_enum level_;
};

// launcher_scripts_path is mounted into containers and data_dir and base_results_dir default
// to directories under it: it must be an existing directory (NeMo's launcher_scripts, or the
// directory holding conf/), not a path that a typo would turn into a new tree of results.
void check_scripts_root(const fs::path& scripts_root) {
  if (scripts_root.empty()) {
    common::fail("launcher_scripts_path is empty: it must be a directory (leave it ??? for the "
                 "directory holding conf/)");
  }
  std::error_code error;
  if (!fs::is_directory(scripts_root, error)) {
    common::fail("launcher_scripts_path={}: no such directory; give an existing one (leave it ??? "
                 "for the directory holding conf/)", scripts_root.string());
  }
}

// A directory that holds the launcher's templates: one of each script cluster type's.
bool holds_templates(const fs::path& directory) {
  std::error_code error;
  for (const char* name : {"local.sh.mustache", "bcm.sbatch.mustache", "pbs.pbs.mustache"}) {
    if (!fs::is_regular_file(directory / name, error)) return false;
  }
  return true;
}

// unique_output_dir: creates the launch's own directory (base_results_dir as resolved, which
// ends in results-<timestamp>), or the next free -N of it. The jobs of one multirun (job 1, 2,
// ... after job 0 in this process) share job 0's, as they share its timestamp.
fs::path reserve_unique_output_dir(const fs::path& wanted, std::optional<size_t> job_number) {
  static std::map<fs::path, fs::path> reserved;  // wanted → created, in this process
  if (job_number && *job_number > 0) {
    const auto found = reserved.find(wanted);
    std::error_code error;
    if (found != reserved.end() && fs::is_directory(found->second, error)) return found->second;
  }
  const fs::path created = create_unique_directory(wanted, "base_results_dir (unique_output_dir)");
  reserved[wanted] = created;
  return created;
}

// The reserved directory goes away again when the launch stops before writing into it (a
// refused value), so that a refusal leaves nothing behind; remove() only removes it empty.
class ReservedDirectory {
 public:
  explicit ReservedDirectory(fs::path path) : path_(std::move(path)) {}
  ~ReservedDirectory() {
    std::error_code ignored;
    if (fs::is_empty(path_, ignored)) fs::remove(path_, ignored);
  }
  ReservedDirectory(const ReservedDirectory&) = delete;
  ReservedDirectory& operator=(const ReservedDirectory&) = delete;

 private:
  fs::path path_;
};

// The names and directories a job's files get, checked before any is created.
void check_job_names_and_paths(const JobSpec& job) {
  const std::string section = job.stage;
  check_file_name_part(job.run_name, section + ".run.name");
  check_file_name_part(job.job_name,
                       fmt::format("the job name (cluster.job_name_prefix + {}.run.name)", section));
  check_directory_path(job.results_dir, section + ".run.results_dir");
}

// base_results_dir and data_dir are the roots everything else is put under: empty, they would
// put runs and data at the file system's root (${base_results_dir}/<run> is /<run>).
void check_root_directories(const Node& config) {
  for (const char* key : {"base_results_dir", "data_dir"}) {
    const Node* value = find(config, key);
    if (value == nullptr || value->is_null()) continue;
    if (!value->is_string()) common::fail("{}: expected a directory path", key);
    if (value->as_string().empty()) {
      common::fail("{} is empty: everything under it would go to the file system's root (/); "
                   "give a directory, e.g. {}=/path/to/dir",
                   key, key);
    }
  }
}

}  // namespace

fs::path find_conf_dir(const std::optional<fs::path>& requested) {
  auto usable = [](const fs::path& dir) {
    std::error_code error;  // a path the file system refuses (too long, say) is not usable
    return fs::is_regular_file(dir / "config.yaml", error);
  };
  if (requested) {
    if (!usable(*requested)) {
      common::fail("--config-dir {}: no config.yaml there", requested->string());
    }
    return fs::absolute(*requested);
  }
  if (const char* from_env = std::getenv("LAUNCHER_CONF_DIR")) {
    if (!usable(from_env)) common::fail("LAUNCHER_CONF_DIR={}: no config.yaml there", from_env);
    return fs::absolute(from_env);
  }
  // The build tree's bin/ two levels below the source; an installed bin/ beside
  // share/megatron_native (`cmake --install`); the source tree the build came from.
  for (const fs::path& candidate : {executable_dir() / ".." / ".." / "conf",
                                    installed_data_dir() / "conf",
                                    fs::path(LAUNCHER_SOURCE_DIR) / "conf"}) {
    if (usable(candidate)) return fs::weakly_canonical(candidate);
  }
  common::fail("no conf/ directory found: pass --config-dir DIR or set LAUNCHER_CONF_DIR");
}

fs::path find_templates_dir(const fs::path& launcher_scripts_path) {
  if (const char* from_env = std::getenv("LAUNCHER_TEMPLATES_DIR")) {
    if (!holds_templates(from_env)) {
      common::fail("LAUNCHER_TEMPLATES_DIR={}: the launcher's templates (local.sh.mustache, "
                   "bcm.sbatch.mustache, pbs.pbs.mustache) are not there", from_env);
    }
    return fs::absolute(from_env);
  }
  std::error_code error;
  if (!launcher_scripts_path.empty() && fs::is_directory(launcher_scripts_path / "templates", error)) {
    return launcher_scripts_path / "templates";
  }
  const std::vector<fs::path> installed = {executable_dir() / ".." / ".." / "templates",
                                           installed_data_dir() / "templates",
                                           fs::path(LAUNCHER_SOURCE_DIR) / "templates"};
  for (const fs::path& candidate : installed) {
    if (holds_templates(candidate)) return fs::weakly_canonical(candidate);
  }
  common::fail("the launcher's job script templates were not found: not in "
               "launcher_scripts_path={}/templates, {}, {} or {}; set LAUNCHER_TEMPLATES_DIR to "
               "the templates/ directory of the launcher's source tree",
               launcher_scripts_path.string(), installed[0].string(), installed[1].string(),
               installed[2].string());
}

ClusterChoice resolve_cluster_type(const std::string& configured) {
  // NeMo's name for running on this machine without a scheduler.
  if (configured == "interactive") return {"local", "NeMo's interactive: on this machine"};
  if (configured == "bcp") {
    common::fail("cluster_type 'bcp' (NVIDIA Base Command Platform) is not supported: use bcm "
                 "(Slurm), pbs, k8s or local");
  }
  if (configured != "auto") return {configured, "as configured"};
  if (!find_on_path("sbatch")) return {"local", "no sbatch on PATH"};
  // The Slurm client alone (e.g. installed for tests) is not a cluster: submitting would fail.
  const char* slurm_conf = std::getenv("SLURM_CONF");
  if (slurm_conf != nullptr && *slurm_conf != '\0') return {"bcm", "sbatch on PATH, SLURM_CONF set"};
  if (fs::exists("/etc/slurm/slurm.conf")) return {"bcm", "sbatch on PATH, /etc/slurm/slurm.conf"};
  return {"local", "sbatch on PATH but no Slurm configuration (SLURM_CONF, /etc/slurm/slurm.conf)"};
}

LaunchComposition compose_for_launch(const MainOptions& options) {
  const fs::path conf_dir = find_conf_dir(options.conf_dir);

  // cluster_type picks the cluster group option of the same name unless cluster= was given.
  // It is read from a composition without the cluster.* overrides: those belong to the group
  // that cluster_type selects, not to the default one (cluster_type=bcm cluster.gres=null).
  std::vector<std::string> without_cluster_keys;
  for (const auto& override_text : options.overrides) {
    if (!override_target(override_text).starts_with("cluster.")) {
      without_cluster_keys.push_back(override_text);
    }
  }
  const ComposedConfig probe = compose({conf_dir, "config", without_cluster_keys});
  const Node* configured_type = find(probe.config, "cluster_type");
  const std::string configured = configured_type && configured_type->is_string()
                                     ? configured_type->as_string() : "auto";
  ClusterChoice choice = resolve_cluster_type(configured);
  if (configured == "auto") spdlog::info("cluster_type auto → {} ({})", choice.type, choice.reason);
  // The back end is chosen here, once: an unknown cluster_type is refused before it is composed.
  std::shared_ptr<const Cluster> backend = make_cluster(choice.type);
  ComposeOptions compose_options{conf_dir, "config", options.overrides};
  // A tree without an option of that name (NeMo's has only cluster/bcm.yaml) keeps its own
  // choice: the local cluster reads only job_name_prefix from it, as NeMo's interactive mode.
  std::error_code missing;
  const bool tree_has_option = fs::exists(conf_dir / "cluster" / (choice.type + ".yaml"), missing);
  if (!user_chose_group(options.overrides, "cluster") && tree_has_option &&
      probe.choices.count("cluster") && probe.choices.at("cluster") != choice.type) {
    compose_options.overrides.insert(compose_options.overrides.begin(), "cluster=" + choice.type);
  }
  ComposedConfig composed = compose(compose_options);

  fill_launcher_scripts_path(composed.config, conf_dir);  // ??? → the directory holding conf/
  const bool unique_output_dir = wants_unique_output_dir(composed.config);
  if (unique_output_dir) {
    Node* base = find(composed.config, "base_results_dir");
    if (base == nullptr || !base->is_string()) {
      common::fail("unique_output_dir needs base_results_dir to be a path");
    }
    // Appended to the unresolved text, so interpolations in it still resolve.
    *base = Node::string(base->as_string() + "/results-" + launch_timestamp(), base->location());
  }
  fill_data_preparation_blend(composed);  // data_preparation.data_prefix: ??? → its outputs
  return {std::move(composed), std::move(choice), std::move(backend), conf_dir, unique_output_dir};
}

namespace {

// Job k of a multirun writes into <run.results_dir>/<k> (Hydra's sweep.dir/<job.num>). The
// suffix goes onto the unresolved run.results_dir (and run.train_dir, where a later stage finds
// the training run) of every stage section, so whatever interpolates them (exp_manager's log
// dir, hence checkpoints; conversion's checkpoint folder) follows: two jobs of one sweep never
// share, or resume from, each other's checkpoints.
void give_job_its_own_results_dirs(Node& config, size_t job_number) {
  if (!config.is_map()) return;
  for (MapEntry& section : config.entries()) {
    for (const char* key : {"run.results_dir", "run.train_dir"}) {
      Node* directory = section.value.is_map() ? find(section.value, key) : nullptr;
      if (directory == nullptr || !directory->is_string()) continue;
      *directory = Node::string(fmt::format("{}/{}", directory->as_string(), job_number),
                                directory->location());
    }
  }
}

}  // namespace

int launch_main(const MainOptions& options, std::ostream& terminal) {
  LaunchComposition launch = compose_for_launch(options);
  ComposedConfig& composed = launch.composed;
  if (options.job_number) give_job_its_own_results_dirs(composed.config, *options.job_number);
  const Cluster& backend = *launch.backend;
  std::optional<ReservedDirectory> reserved;
  if (launch.unique_output_dir) {
    // The timestamp is to the second, so launches started within one second want the same
    // name: the directory is created here, exclusively, before anything is written into it,
    // and base_results_dir becomes what was created (as resolved: a ${now:...} in it is not
    // evaluated a second time).
    const Node first = resolve(composed.config, ResolveContext{composed.choices});
    check_root_directories(first);
    const fs::path created =
        reserve_unique_output_dir(text_at(first, "base_results_dir"), options.job_number);
    reserved.emplace(created);
    Node* base = find(composed.config, "base_results_dir");
    *base = Node::string(created.string(), base->location());
  }
  const Node config = resolve(composed.config, ResolveContext{composed.choices});
  check_root_directories(config);

  const fs::path scripts_root = text_at(config, "launcher_scripts_path");
  std::string bin_dir_text = text_at(config, "backend_bin_dir");
  const fs::path backend_bin_dir = bin_dir_text.empty() ? executable_dir() : fs::path(bin_dir_text);
  const Node* cluster = find(config, "cluster");
  if (cluster == nullptr || !cluster->is_map()) {
    common::fail("the config has no `cluster` section (choose one with cluster=<option>)");
  }
  const std::string job_name_prefix = text_at(*cluster, "job_name_prefix");

  const Node* stages = find(config, "stages");
  if (stages == nullptr || !stages->is_list() || stages->size() == 0) {
    common::fail("stages: expected a non-empty list, e.g. stages=[training]");
  }
  {
    // NeMo's stage names (export, fine_tuning, ...) are refused here, saying why, before the
    // preflight and before anything is written.
    std::vector<std::string> stage_names;
    for (size_t i = 0; i < stages->size(); ++i) {
      stage_names.push_back(stages->at(i).as_string(fmt::format("stages.{}", i)));
    }
    check_stage_names(stage_names);
  }
  for (size_t i = 0; i < stages->size(); ++i) {
    if (stages->at(i).is_string() && stages->at(i).as_string() == "training") {
      const auto training_choice = composed.choices.find("training");
      check_training_family(training_choice == composed.choices.end() ? std::nullopt
                                                                       : training_choice->second);
      // Before anything is written or queued.
      enforce_training_preflight(config, backend.name(), options.dry_run);
    }
  }
  const StageContext stage_context{config, backend_bin_dir, job_name_prefix};
  // Every job of every stage first, so that a bad value anywhere is reported before anything
  // is written or queued.
  std::vector<JobSpec> jobs;
  for (size_t i = 0; i < stages->size(); ++i) {
    const std::string stage = stages->at(i).as_string(fmt::format("stages.{}", i));
    for (JobSpec& job : build_stage_jobs(stage, stage_context)) jobs.push_back(std::move(job));
  }
  const std::vector<std::pair<std::string, std::string>> environment = job_environment(config);
  backend.check_launch(jobs, config, *cluster, options.dry_run);

  // Everything that can be wrong with a value is found before the first directory is created:
  // the paths and names that become directories and files, the config as YAML, and every
  // script (rendered here once, then again when it is written, with the job id it depends on).
  check_scripts_root(scripts_root);
  // NeMo writes the stage's own section (what its training script reads with --config-name)
  // as <run>_hydra.yaml, so a NeMo user comparing the two files sees the same keys; the whole
  // config, which NeMo keeps nowhere, goes beside it as <run>_launcher_config.yaml.
  const std::string whole_config_yaml = to_yaml(config);
  std::map<std::string, std::string> stage_config_yaml;
  for (const JobSpec& job : jobs) {
    if (stage_config_yaml.contains(job.stage)) continue;
    const Node* section = find(config, job.stage);
    stage_config_yaml[job.stage] = section == nullptr ? std::string() : to_yaml(*section);
  }
  const RenderContext context{find_templates_dir(scripts_root), cluster,
                              text_at(config, "container"), container_mounts(config)};
  std::vector<fs::path> script_paths;
  for (JobSpec& job : jobs) {
    // The stage's own variables first, then env_vars; a name in both takes env_vars' value.
    for (const auto& variable : environment) {
      std::erase_if(job.environment,
                    [&](const auto& entry) { return entry.first == variable.first; });
      job.environment.push_back(variable);
    }
    check_job_names_and_paths(job);
    script_paths.push_back(job.results_dir / (job.job_name + std::string(backend.script_suffix())));
    (void)backend.render(job, script_paths.back(), context);
  }

  // Then each results directory is taken, so that a second launch of the same run cannot mix
  // its scripts and configs with this one's (held until this launcher exits, a foreground
  // local job included).
  // Keyed by the directory as the file system resolves it: two stages may spell one directory
  // differently (a/b, a/b/, a/./b), and a second lock on it would be refused by the first.
  std::map<fs::path, ResultsDirLock> locks;
  auto resolved = [](const fs::path& directory) {
    std::error_code error;
    const fs::path canonical = fs::canonical(directory, error);
    return error ? directory.lexically_normal() : canonical;
  };
  for (const JobSpec& job : jobs) {
    create_results_dir(job.results_dir, job.stage + ".run.results_dir");
    const fs::path key = resolved(job.results_dir);
    if (!locks.contains(key)) locks.emplace(key, ResultsDirLock(job.results_dir));
  }

  // The last job submitted: the next runs after it (afterany as NeMo, afterok when the next
  // needs its output). A stage with nothing to submit leaves the chain as it is, unbroken.
  std::string previous_job_id;
  bool previous_needs_success = false;
  bool previous_succeeded = true;  // how the job before ended, when it ran here (local)
  int exit_status = 0;
  std::set<fs::path> log_files;  // one launcher.log sink per results directory
  for (std::size_t index = 0; index < jobs.size(); ++index) {
    JobSpec& job = jobs[index];
    const fs::path& script_path = script_paths[index];
    const std::string label = job.step.empty() ? job.stage : job.stage + "." + job.step;
    job.after_job_id = previous_job_id;
    job.after_condition = previous_needs_success ? "afterok" : "afterany";

    if (log_files.insert(job.results_dir / "launcher.log").second) {
      common::add_log_file(job.results_dir / "launcher.log");
    }
    common::write_text_file_atomically(job.results_dir / (job.run_name + "_hydra.yaml"),
                                       stage_config_yaml.at(job.stage));
    common::write_text_file_atomically(job.results_dir / (job.run_name + "_launcher_config.yaml"),
                                       whole_config_yaml);
    common::write_text_file_atomically(job.results_dir / "launcher_cmd.log", options.command_line + "\n");
    std::string script;
    {
      // Rendered once already: what it had to say (e.g. sbatch options passed through) is said.
      const QuietLog quiet;
      script = backend.render(job, script_path, context);
    }
    write_script(script_path, script);
    spdlog::info("{}: results in {}, job script {}", label, job.results_dir.string(), script_path.string());
    if (options.dry_run) {
      spdlog::info("dry run: not submitting {}", script_path.string());
      continue;
    }
    if (job.after_condition == "afterok" && !previous_succeeded) {
      // As Slurm cancels a job whose afterok dependency failed (--kill-on-invalid-dep=yes). Only
      // a job that ran to its end here (local) has failed before the next is submitted.
      spdlog::warn("{}: not run: it needs the job before it to succeed (afterok), and that one "
                   "failed or did not run", label);
      previous_needs_success = job.successors_need_success;
      continue;
    }
    JobRecord record{label, std::string(backend.name()), "", script_path, {}, std::nullopt,
                     std::time(nullptr)};
    const SubmitContext submit_context{
        cluster, label, &terminal, options.local_time_limit,
        // A detached local job keeps its results directory taken while it runs.
        [&] { locks.at(resolved(job.results_dir)).share_with_children(); }};
    const Submission submission = backend.submit(job, script_path, submit_context);
    if (submission.job_id.empty()) continue;  // written, not submitted: nothing to track
    if (submission.exit_code) {
      // It ran to its end here (local jobs run one after the other). Like afterany, a failed
      // stage does not stop the next unless that one needs its output (afterok); the
      // launcher's exit status reports the first failure.
      if (*submission.exit_code != 0 && exit_status == 0) exit_status = *submission.exit_code;
      previous_succeeded = *submission.exit_code == 0;
    }
    if (backend.chains_jobs()) previous_job_id = submission.job_id;
    record.job_id = submission.job_id;
    record.log_file = submission.log_file;
    record.exit_code = submission.exit_code;
    record.timed_out = submission.timed_out;
    // A local job's interrupted_by: the launcher stops after its record.
    const int stop_signal = submission.interrupted_by;
    previous_needs_success = job.successors_need_success;
    append_job_record(job.results_dir, record);
    if (stop_signal != 0) {
      // The launcher was asked to stop (Ctrl-C, SIGTERM) and passed it on to the job: with its
      // record kept, this process ends by the same signal, so a sweep or an autoconfig search
      // stops here rather than going on to its next job.
      const char* abbreviation = sigabbrev_np(stop_signal);
      spdlog::warn("{}: stopped by {}: local job {} was signalled and has ended", label,
                   abbreviation != nullptr ? std::string("SIG") + abbreviation
                                           : std::to_string(stop_signal),
                   record.job_id);
      stop_by_signal(stop_signal);
    }
  }
  return exit_status;
}

}  // namespace launcher
