// Job records, scheduler state queries, `launcher status` and `launcher logs`; see
// run_status.hpp.
#include "launcher/run_status.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <iostream>
#include <sstream>

#include "backend/common/error.hpp"
#include "backend/common/local_time.hpp"
#include "backend/common/small_file.hpp"
#include "launcher/clusters/cluster.hpp"
#include "launcher/iteration_log.hpp"

namespace launcher {

namespace fs = std::filesystem;

namespace {

constexpr const char* kRecordFile = "jobs.jsonl";

}  // namespace

void append_job_record(const fs::path& results_dir, const JobRecord& record) {
  nlohmann::json line = {{"stage", record.stage},
                         {"cluster", record.cluster},
                         {"job_id", record.job_id},
                         {"script", record.script.string()},
                         {"log_file", record.log_file.string()},
                         {"submitted_at", static_cast<int64_t>(record.submitted_at)}};
  if (record.exit_code) line["exit_code"] = *record.exit_code;
  if (record.timed_out) line["timed_out"] = true;
  std::ofstream out(results_dir / kRecordFile, std::ios::app);
  // JSON is UTF-8: bytes that are not (a path from an environment variable, say) are replaced
  // by U+FFFD rather than refused, so the job is still recorded.
  out << line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
  if (!out) common::fail("cannot append to {}", (results_dir / kRecordFile).string());
}

std::vector<JobRecord> read_job_records(const fs::path& results_dir) {
  const fs::path path = results_dir / kRecordFile;
  const std::optional<std::string> records_text = common::read_small_file_if_exists(path, "the job records");
  if (!records_text) {
    common::fail("{}: no job records (nothing was launched into this directory)", path.string());
  }
  std::istringstream in(*records_text);
  std::vector<JobRecord> records;
  std::string text;
  for (int line_number = 1; std::getline(in, text); ++line_number) {
    if (text.empty()) continue;
    try {
      const auto line = nlohmann::json::parse(text);
      JobRecord record;
      record.stage = line.at("stage").get<std::string>();
      record.cluster = line.at("cluster").get<std::string>();
      record.job_id = line.at("job_id").get<std::string>();
      record.script = line.at("script").get<std::string>();
      record.log_file = line.at("log_file").get<std::string>();
      record.submitted_at = line.at("submitted_at").get<int64_t>();
      if (line.contains("exit_code")) record.exit_code = line.at("exit_code").get<int>();
      if (line.contains("timed_out")) record.timed_out = line.at("timed_out").get<bool>();
      records.push_back(std::move(record));
    } catch (const nlohmann::json::exception& error) {
      common::fail("{}:{}: not a job record: {}", path.string(), line_number, error.what());
    }
  }
  return records;
}

std::string query_job_state(const JobRecord& record) {
  // Each back end asks its own scheduler (or, local, reads the recorded exit status).
  const std::unique_ptr<Cluster> cluster = find_cluster(record.cluster);
  if (cluster == nullptr) return "unknown (cluster type '" + record.cluster + "')";
  return cluster->job_state(record);
}

std::vector<fs::path> find_run_dirs(const fs::path& base) {
  std::vector<fs::path> runs;
  std::error_code error;
  if (!fs::is_directory(base, error)) return runs;
  for (auto it = fs::recursive_directory_iterator(base, error); it != fs::recursive_directory_iterator();
       it.increment(error)) {
    if (error) break;
    if (it.depth() > 2) {
      it.disable_recursion_pending();
      continue;
    }
    if (it->is_directory(error) && fs::exists(it->path() / kRecordFile, error)) {
      runs.push_back(it->path());
    }
  }
  std::sort(runs.begin(), runs.end());
  return runs;
}

fs::path resolve_run_dir(const std::string& run_or_path, const fs::path& base) {
  // error_code overloads: a name the file system refuses (too long, say) is just not a run.
  std::error_code error;
  if (fs::exists(fs::path(run_or_path) / kRecordFile, error)) return run_or_path;
  if (fs::exists(base / run_or_path / kRecordFile, error)) return base / run_or_path;
  std::string known;
  for (const auto& run : find_run_dirs(base)) {
    known += (known.empty() ? "" : ", ") + fs::relative(run, base).string();
  }
  common::fail("'{}' is neither a results directory with {} nor a run under {} (runs there: {})",
               run_or_path, kRecordFile, base.string(), known.empty() ? "none" : known);
}

std::string job_progress(const JobRecord& record, const std::string& state) {
  // Only a running job's progress says something a finished one's state does not.
  if (!state.starts_with("RUNNING") || record.log_file.empty()) return "-";
  const std::optional<Progress> progress = read_progress(record.log_file);
  return progress ? format_progress(*progress) : "-";
}

void print_status(const std::vector<fs::path>& run_dirs, std::ostream& out) {
  out << fmt::format("{:<32} {:<17} {:<6} {:<24} {:<20} {:<24} {:<28} {}\n", "run", "stage",
                     "cluster", "job id", "submitted", "state", "progress", "log");
  for (const auto& run_dir : run_dirs) {
    for (const auto& record : read_job_records(run_dir)) {
      const std::string state = query_job_state(record);
      out << fmt::format("{:<32} {:<17} {:<6} {:<24} {:<20} {:<24} {:<28} {}\n",
                         run_dir.filename().string(), record.stage, record.cluster, record.job_id,
                         common::format_local_time(record.submitted_at), state,
                         job_progress(record, state), record.log_file.string());
    }
  }
}

int print_logs(const fs::path& run_dir, bool follow, std::ostream& out) {
  const auto records = read_job_records(run_dir);
  auto newest = std::find_if(records.rbegin(), records.rend(),
                             [](const JobRecord& record) { return !record.log_file.empty(); });
  if (newest == records.rend()) {
    common::fail("{}: no job of this run has a log file (Kubernetes: kubectl logs)", run_dir.string());
  }
  const std::string log = newest->log_file.string();
  if (follow) {
    // The progress line goes to stderr: stdout stays the log itself, as tail prints it.
    const std::string state = query_job_state(*newest);
    const std::string progress = job_progress(*newest, state);
    if (progress != "-") {
      std::cerr << fmt::format("job {} is {}: iteration {}\n", newest->job_id, state, progress)
                << std::flush;
    }
    // tail -F waits for a log that a queued job has not created yet, and follows renames.
    execlp("tail", "tail", "-n", "+1", "-F", log.c_str(), static_cast<char*>(nullptr));
    common::fail("cannot run tail to follow {}", log);
  }
  std::ifstream in(log);
  if (!in) {
    common::fail("{} does not exist yet (job {} is {})", log, newest->job_id, query_job_state(*newest));
  }
  out << in.rdbuf();
  return 0;
}

}  // namespace launcher
