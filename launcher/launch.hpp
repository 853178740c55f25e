// `launcher main`: compose the config, pick the cluster, build each stage's job, write the
// results directory (NeMo's layout) and submit. The flow, end to end:
//   conf/ + overrides → compose (config/) → resolve → per stage: JobSpec (stages/)
//   → render script (clusters/, templates/) → results/<run>/ → submit / run
#pragma once

#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "launcher/config/compose.hpp"

namespace launcher {

struct MainOptions {
  std::vector<std::string> overrides;         // key=value ..., as typed
  std::optional<std::filesystem::path> conf_dir;  // --config-dir; default: see find_conf_dir
  bool dry_run = false;                       // write everything, submit nothing
  // Multirun: job k of a sweep writes into <run.results_dir>/<k>, as Hydra's
  // sweep.dir/<job.num>, so no two combinations share a results directory.
  std::optional<size_t> job_number;
  std::string command_line;                   // for launcher_cmd.log
  // Local jobs are stopped when they run longer (autoconfig's max_minutes_per_run; Slurm jobs
  // get the same limit as their --time from <stage>.run.time_limit). Unset: no limit.
  std::optional<std::chrono::milliseconds> local_time_limit;
};

// conf/ in this order: --config-dir, $LAUNCHER_CONF_DIR, <executable>/../../conf (a build
// tree inside the checkout), <executable>/../share/megatron_native/conf (`cmake --install`),
// the source tree the launcher was built from.
std::filesystem::path find_conf_dir(const std::optional<std::filesystem::path>& requested);

// The job script templates belong to the launcher, not to the conf tree (a NeMo tree has
// none), in this order: $LAUNCHER_TEMPLATES_DIR; <launcher_scripts_path>/templates when that
// directory exists (a checkout, or a copy made on purpose: how templates were chosen so far);
// <launcher executable>/../../templates (a build tree inside the checkout);
// <launcher executable>/../share/megatron_native/templates (`cmake --install`); the source tree
// the launcher was built from. A common::Error names what was tried when none holds them.
std::filesystem::path find_templates_dir(const std::filesystem::path& launcher_scripts_path);

struct ClusterChoice {
  std::string type;    // bcm, local, ...
  std::string reason;  // said in the log line when the type was auto
};

// Resolves `cluster_type: auto`: bcm when sbatch is on PATH and Slurm is configured
// (SLURM_CONF set, or /etc/slurm/slurm.conf), local otherwise. Other values pass through.
ClusterChoice resolve_cluster_type(const std::string& configured);

class Cluster;  // launcher/clusters/cluster.hpp

struct LaunchComposition {
  ComposedConfig composed;  // unresolved, with launcher_scripts_path and unique dirs filled in
  ClusterChoice cluster;
  // The back end of cluster.type, chosen once (make_cluster); shared_ptr, so that this header
  // needs only its declaration.
  std::shared_ptr<const Cluster> backend;
  std::filesystem::path conf_dir;
  // unique_output_dir: base_results_dir ends in /results-<timestamp>, to the second; launching
  // creates it exclusively, with a -1, -2, ... suffix when that name is taken.
  bool unique_output_dir = false;
};

// Everything `launcher main` composes before resolving, shared with --cfg so that what is
// printed is what would be launched: conf dir, cluster_type → cluster group (composed without
// the cluster.* overrides first) and back end, launcher_scripts_path ???, unique_output_dir.
LaunchComposition compose_for_launch(const MainOptions& options);

// Runs `launcher main`. Returns the process exit status (a failed local job's status).
int launch_main(const MainOptions& options, std::ostream& terminal);

}  // namespace launcher
