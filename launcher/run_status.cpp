// Job records, scheduler state queries, `launcher status` and `launcher logs`; see
// run_status.hpp.
#include "launcher/run_status.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>

#include "backend/common/error.hpp"
#include "backend/common/local_time.hpp"
#include "backend/common/small_file.hpp"
#include "launcher/iteration_log.hpp"
#include "launcher/process.hpp"

namespace launcher {

namespace fs = std::filesystem;

namespace {

constexpr const char* kRecordFile = "jobs.jsonl";

// The value after "key" in scheduler output such as "JobState=RUNNING Reason=None" or
// "job_state = R", up to the next whitespace.
std::string field_after(const std::string& text, const std::string& key) {
  const size_t at = text.find(key);
  if (at == std::string::npos) return {};
  size_t begin = at + key.size();
  while (begin < text.size() && (text[begin] == ' ' || text[begin] == '=')) ++begin;
  size_t end = begin;
  while (end < text.size() && !std::isspace(static_cast<unsigned char>(text[end]))) ++end;
  return text.substr(begin, end - begin);
}

std::string first_line(const std::string& text) {
  std::string line = text.substr(0, text.find('\n'));
  while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back()))) line.pop_back();
  return line;
}

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
  if (record.cluster == "local") {
    std::optional<int> exit_code = record.exit_code;
    if (!exit_code) {
      // A detached job writes its exit status next to its script when it ends.
      std::istringstream status_file(
          common::read_small_file_if_exists(
              record.script.parent_path() / (".job-" + record.job_id + ".exit"),
              "the job's exit status")
              .value_or(""));
      int status = 0;
      if (status_file >> status) {
        exit_code = status;
      } else {
        std::error_code error;
        return fs::exists("/proc/" + record.job_id, error) ? "RUNNING"
                                                           : "unknown (no exit status recorded)";
      }
    }
    // Slurm's word for a job ended at its time limit.
    if (record.timed_out) return "TIMEOUT";
    return *exit_code == 0 ? "COMPLETED" : fmt::format("FAILED (exit {})", *exit_code);
  }
  auto ask = [](const std::vector<std::string>& argv) -> std::optional<CapturedRun> {
    if (!find_on_path(argv.front())) return std::nullopt;
    return run_and_capture(argv);
  };
  if (record.cluster == "bcm") {
    const auto run = ask({"scontrol", "show", "job", "-o", record.job_id});
    if (!run) return "unknown (no scontrol on PATH)";
    // One line per job; a job array gives one per task (or per pending range of tasks), and
    // its state is each distinct task state with how many tasks are in it.
    std::map<std::string, int> counts;  // sorted: the summary does not depend on scontrol's order
    std::istringstream lines(run->output);
    for (std::string line; std::getline(lines, line);) {
      const std::string state = field_after(line, "JobState=");
      if (state.empty()) continue;
      const std::string exit_code = field_after(line, "ExitCode=");
      const std::string shown =
          exit_code.empty() || exit_code == "0:0" ? state : state + " (exit " + exit_code + ")";
      ++counts[shown];
    }
    if (run->exit_code != 0 || counts.empty()) return "unknown (" + first_line(run->output) + ")";
    if (counts.size() == 1 && counts.begin()->second == 1) return counts.begin()->first;
    std::string summary;
    for (const auto& [state, count] : counts) {
      summary += fmt::format("{}{} ×{}", summary.empty() ? "" : ", ", state, count);
    }
    return summary;
  }
  if (record.cluster == "pbs") {
    const auto run = ask({"qstat", "-f", "-x", record.job_id});
    if (!run) return "unknown (no qstat on PATH)";
    const std::string state = field_after(run->output, "job_state");
    if (run->exit_code == 0 && !state.empty()) {
      static const std::pair<const char*, const char*> names[] = {
          {"Q", "QUEUED"}, {"R", "RUNNING"}, {"H", "HELD"}, {"E", "EXITING"}, {"F", "FINISHED"}};
      for (const auto& [letter, name] : names) {
        if (state == letter) {
          const std::string exit_status = field_after(run->output, "Exit_status");
          return exit_status.empty() ? name : fmt::format("{} (exit {})", name, exit_status);
        }
      }
      return state;
    }
    return "unknown (" + first_line(run->output) + ")";
  }
  if (record.cluster == "k8s") {
    const auto run = ask({"kubectl", "get", "pytorchjob", record.job_id, "-o",
                          "jsonpath={.status.conditions[-1:].type}"});
    if (!run) return "unknown (no kubectl on PATH)";
    const std::string state = first_line(run->output);
    return run->exit_code == 0 && !state.empty() ? state : "unknown (" + state + ")";
  }
  return "unknown (cluster type '" + record.cluster + "')";
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
