// `launcher autoconfig`: NeMo's auto-configurator. Enumerates the layouts of search_space.hpp,
// prunes them by NeMo's rules and by the preflight (training_preflight.hpp: the launcher's
// checks and its memory estimate against cluster.gpu_memory_gb), runs the survivors as short
// benchmark-mode training runs through `launcher main` (mock data, no validation, a few steps;
// one after the other on the local cluster, stopped at max_minutes_per_run; one Slurm job per
// candidate with that --time on bcm), reads each run's benchmark.json and ranks them by
// measured tokens/s. Writes into <base_results_dir>/autoconfig_<model>[-N]:
//   candidates/<layout>/           each candidate's results directory (launcher main's layout)
//   candidates.json, candidates.csv  every candidate: layout, memory estimate, status, numbers
//   best/<model>.yaml              the training config with the fastest layout applied
// Reference: NeMo-Framework-Launcher auto_configurator (search_config.yaml train_settings,
// autoconfig/training_config.py); docs/launcher.md says what is supported and what differs.
#pragma once

#include <filesystem>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "launcher/autoconfig/search_space.hpp"

namespace launcher {

struct AutoconfigOptions {
  std::vector<std::string> arguments;            // key=value: search settings and overrides
  std::optional<std::filesystem::path> conf_dir;  // --config-dir
  bool dry_run = false;                           // the enumeration and pruning table only
  // --save-as NAME: the best config also as <conf dir>/training/NAME.yaml (never over an
  // existing one).
  std::string save_as;
  std::string command_line;
};

// What became of one candidate.
struct CandidateResult {
  Layout layout;
  int64_t data_parallel = 0;
  double estimated_bytes = 0;  // per GPU, the preflight's estimate; 0: not estimated
  // pruned (a NeMo rule), does_not_fit (memory), preflight (another preflight problem),
  // skipped (beyond limit_search_runs), planned (dry run), ran, failed, timed_out, unfinished
  std::string status;
  std::string detail;  // the rule and numbers, the error, or the job's state
  std::filesystem::path results_dir;
  std::filesystem::path log_file;
  std::optional<int> exit_code;
  double tokens_per_second = 0;
  double median_step_ms = 0;
  int rank = 0;  // 1 = fastest; 0 for candidates that did not run to completion
};

// Ran candidates by tokens/s (descending; ties by step time, then enumeration order), ranks
// 1, 2, ... set; then timed out, failed, unfinished, skipped, planned and pruned ones, each in
// enumeration order.
void rank_candidates(std::vector<CandidateResult>& candidates);

// The table as the terminal shows it (Markdown).
std::string format_candidate_table(const std::vector<CandidateResult>& candidates);

// Runs the search; returns the exit status (0 when at least one candidate ran, or on a dry
// run; 1 when none did). Bad settings are a common::Error before anything runs.
int run_autoconfig(const AutoconfigOptions& options, std::ostream& terminal);

}  // namespace launcher
