// What was launched, and where it stands. Each launch appends one JSON line per submitted job
// to <results_dir>/jobs.jsonl (stage, cluster, job id, script, log, exit status of local jobs,
// time), so earlier launches stay listed. `launcher status` reads those records and asks the
// scheduler for each job's state (Slurm: scontrol; PBS: qstat; Kubernetes: kubectl; local
// jobs: the recorded exit status); `launcher logs` prints or follows the newest job log.
#pragma once

#include <ctime>
#include <filesystem>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

namespace launcher {

struct JobRecord {
  std::string stage;
  std::string cluster;  // local, bcm, pbs, k8s
  std::string job_id;
  std::filesystem::path script;
  std::filesystem::path log_file;  // empty when unknown (k8s)
  std::optional<int> exit_code;    // local jobs
  std::time_t submitted_at = 0;
  bool timed_out = false;          // local jobs stopped at their time limit
};

void append_job_record(const std::filesystem::path& results_dir, const JobRecord& record);

// Records in the order written; a malformed line is a common::Error naming file and line.
std::vector<JobRecord> read_job_records(const std::filesystem::path& results_dir);

// The scheduler's word for the job (COMPLETED, RUNNING, PENDING, FAILED, ...), or
// "unknown (<why>)" when the scheduler cannot say.
std::string query_job_state(const JobRecord& record);

// A results directory from a path or a run name under base_results_dir; common::Error when
// neither holds a jobs.jsonl, listing the runs that do.
std::filesystem::path resolve_run_dir(const std::string& run_or_path,
                                      const std::filesystem::path& base_results_dir);

// Directories below base (up to three levels: results-<ts>/<run>/<job>) holding jobs.jsonl.
std::vector<std::filesystem::path> find_run_dirs(const std::filesystem::path& base_results_dir);

// For a RUNNING job whose log has an iteration line: "120/1000 (12%), ETA 1h 03m"
// (iteration_log.hpp); "-" otherwise.
std::string job_progress(const JobRecord& record, const std::string& state);

// The status table for these runs, with each running job's progress.
void print_status(const std::vector<std::filesystem::path>& run_dirs, std::ostream& out);

// Prints the newest job log of a run; with follow, first the job's progress on stderr when it
// is running, then follows the log as `tail -F` does (does not
// return). Returns the exit status for `launcher logs`.
int print_logs(const std::filesystem::path& run_dir, bool follow, std::ostream& out);

}  // namespace launcher
