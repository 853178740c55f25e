// The PBS Pro cluster (ALCF-style: Polaris, Aurora): a script whose #PBS header comes from
// cluster/pbs.yaml and the job (-N, -q, -A, -l select=<nodes>[:extra], -l walltime,
// -l filesystems, -l place, -j oe -o <log>, -W depend=afterany:<id>, afterok:<id> after a job whose output it needs), whose body exports the
// environment and runs the backend under mpiexec (-n nodes × ranks, --ppn ranks per node),
// submitted with qsub, which prints the job id; a job's state is read from `qstat -f -x`.
// References: PBS Pro Reference Guide (qsub, qstat), ALCF Polaris job-scheduling documentation.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "backend/common/error.hpp"
#include "launcher/clusters/cluster.hpp"
#include "launcher/config/scalar_text.hpp"
#include "launcher/process.hpp"

namespace launcher {

namespace {

// qsub reads #PBS lines with its own tokenizer, in which quotes group words; the launcher
// writes each value as one word (double-quoted when it holds a space) and refuses the
// characters that tokenizer could re-read (", ', \) rather than rely on escapes it may lack.
std::string pbs_directive(const std::string& option, const std::string& value) {
  const std::string name = "#PBS " + option;
  refuse_control_characters(name, value);
  if (value.find_first_of("\"'\\") != std::string::npos) {
    common::fail("{}: the value {:?} holds a quote or a backslash, which qsub would read as "
                 "quoting in a #PBS line; use a value without \", ' or \\", name, value);
  }
  return option + " " + (value.find(' ') != std::string::npos ? "\"" + value + "\"" : value);
}

}  // namespace

std::string pbs_walltime(const std::string& limit, std::string_view key) {
  // Slurm's forms: "M", "M:S", "H:M:S", "D-H", "D-H:M", "D-H:M:S"; every field a whole number,
  // the total in seconds checked against overflow at each step.
  auto bad = [&](std::string_view why) -> std::string {
    common::fail("{} '{}' is not a Slurm time{} (valid: minutes, M:S, H:M:S, D-H, D-H:M, D-H:M:S, "
                 "each a whole number)", key, limit, why);
  };
  auto number = [&](std::string_view text) -> std::optional<int64_t> {
    int64_t value = 0;
    if (text.empty() || !std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      return std::nullopt;
    }
    const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (error != std::errc() || end != text.data() + text.size()) return std::nullopt;
    return value;
  };
  const size_t dash = limit.find('-');
  const bool with_days = dash != std::string::npos;
  int64_t days = 0;
  if (with_days) {
    const auto parsed = number(std::string_view(limit).substr(0, dash));
    if (!parsed) return bad("");
    days = *parsed;
  }
  std::vector<int64_t> fields;
  const std::string_view rest = std::string_view(limit).substr(with_days ? dash + 1 : 0);
  for (size_t start = 0;;) {
    const size_t colon = rest.find(':', start);
    const auto parsed = number(rest.substr(start, colon == std::string_view::npos ? colon : colon - start));
    if (!parsed) return bad("");
    fields.push_back(*parsed);
    if (colon == std::string_view::npos) break;
    start = colon + 1;
  }
  int64_t hours = 0, minutes = 0, seconds = 0;
  if (with_days) {
    if (fields.size() > 3) return bad("");
    hours = fields[0];
    minutes = fields.size() > 1 ? fields[1] : 0;
    seconds = fields.size() > 2 ? fields[2] : 0;
  } else if (fields.size() == 1) {
    minutes = fields[0];
  } else if (fields.size() == 2) {
    minutes = fields[0];
    seconds = fields[1];
  } else if (fields.size() == 3) {
    hours = fields[0];
    minutes = fields[1];
    seconds = fields[2];
  } else {
    return bad("");
  }
  // ((days × 24 + hours) × 60 + minutes) × 60 + seconds, each step checked.
  int64_t total = days;
  for (const auto& [factor, addend] : {std::pair<int64_t, int64_t>{24, hours}, {60, minutes}, {60, seconds}}) {
    if (__builtin_mul_overflow(total, factor, &total) || __builtin_add_overflow(total, addend, &total)) {
      return bad(": too long to count in seconds");
    }
  }
  return fmt::format("{}:{:02d}:{:02d}", total / 3600, (total / 60) % 60, total % 60);
}

std::string render_pbs(const JobSpec& job, const std::filesystem::path& script_path,
                       const RenderContext& context) {
  if (job.is_array()) {
    common::fail("{}: job arrays ({} tasks) are not rendered for {}; use cluster_type=bcm or local",
                 job.job_name, job.array_tasks.size(), "PBS");
  }
  const Node& cluster = *context.cluster;
  auto value_of = [&](const char* key) { return text_or(cluster, "cluster", key, ""); };
  std::vector<std::string> directives = {pbs_directive("-N", job.job_name)};
  if (const auto queue = value_of("queue"); !queue.empty()) directives.push_back(pbs_directive("-q", queue));
  if (const auto account = value_of("account"); !account.empty()) {
    directives.push_back(pbs_directive("-A", account));
  }
  std::string select = std::to_string(job.nodes);
  if (const auto extra = value_of("select"); !extra.empty()) select += ":" + extra;
  directives.push_back(pbs_directive("-l", "select=" + select));
  std::string walltime = value_of("walltime");
  if (walltime.empty() && !job.time_limit.empty()) walltime = pbs_walltime(job.time_limit, job.stage + ".run.time_limit");
  if (!walltime.empty()) directives.push_back(pbs_directive("-l", "walltime=" + walltime));
  if (const auto filesystems = value_of("filesystems"); !filesystems.empty()) {
    directives.push_back(pbs_directive("-l", "filesystems=" + filesystems));
  }
  if (const auto place = value_of("place"); !place.empty()) {
    directives.push_back(pbs_directive("-l", "place=" + place));
  }
  // PBS names output files itself unless told; it has no %j, so the log has no job id.
  directives.push_back("-j oe");
  directives.push_back(pbs_directive(
      "-o", (job.results_dir / fmt::format("log-{}.out", job.job_name)).string()));
  if (!job.after_job_id.empty()) {
    directives.push_back(pbs_directive("-W", "depend=" + job.after_condition + ":" + job.after_job_id));
  }

  TemplateData data = common_template_data(job, script_path);
  TemplateData directive_list{TemplateData::type::list};
  for (const auto& line : directives) directive_list.push_back(TemplateData(line));
  data.set("directives", directive_list);
  data.set("total_ranks", std::to_string(job.nodes * job.tasks_per_node));
  data.set("ranks_per_node", std::to_string(job.tasks_per_node));
  return render_template(context.templates_dir, "pbs.pbs.mustache", data);
}

namespace {

Submission submit_qsub(const JobSpec& job, const std::filesystem::path& script_path) {
  const CapturedRun run = run_and_capture({"qsub", script_path.string()});
  // qsub prints the job id (e.g. 1234.polaris-pbs-01) on its first line.
  std::string job_id = run.output.substr(0, run.output.find('\n'));
  while (!job_id.empty() && std::isspace(static_cast<unsigned char>(job_id.back()))) job_id.pop_back();
  if (run.exit_code != 0 || job_id.empty() || job_id.find(' ') != std::string::npos) {
    common::fail("qsub {} failed (exit {}): {}", script_path.string(), run.exit_code, run.output);
  }
  Submission submission;
  submission.job_id = job_id;
  submission.log_file = job.results_dir / fmt::format("log-{}.out", job.job_name);
  return submission;
}

class PbsCluster final : public Cluster {
 public:
  std::string_view name() const override { return "pbs"; }
  std::string_view script_suffix() const override { return "_submission.sh"; }

  void check_launch(const std::vector<JobSpec>& jobs, const Node& /*config*/,
                    const Node& /*cluster*/, bool /*dry_run*/) const override {
    refuse_job_arrays(jobs, name());
  }

  std::string render(const JobSpec& job, const std::filesystem::path& script_path,
                     const RenderContext& context) const override {
    return render_pbs(job, script_path, context);
  }

  Submission submit(const JobSpec& job, const std::filesystem::path& script_path,
                    const SubmitContext& context) const override {
    return announce_queued(submit_qsub(job, script_path), context);
  }

  bool chains_jobs() const override { return true; }

  std::string job_state(const JobRecord& record) const override {
    const auto run = run_if_on_path({"qstat", "-f", "-x", record.job_id});
    if (!run) return "unknown (no qstat on PATH)";
    const std::string state = scheduler_field(run->output, "job_state");
    if (run->exit_code == 0 && !state.empty()) {
      static const std::pair<const char*, const char*> words[] = {
          {"Q", "QUEUED"}, {"R", "RUNNING"}, {"H", "HELD"}, {"E", "EXITING"}, {"F", "FINISHED"}};
      for (const auto& [letter, word] : words) {
        if (state == letter) {
          const std::string exit_status = scheduler_field(run->output, "Exit_status");
          return exit_status.empty() ? word : fmt::format("{} (exit {})", word, exit_status);
        }
      }
      return state;
    }
    return "unknown (" + first_output_line(run->output) + ")";
  }

  // Not yet: autoconfig waits for Slurm's final states only.
  CandidateEnd autoconfig_candidate_end() const override { return CandidateEnd::kUnsupported; }
};

}  // namespace

std::unique_ptr<Cluster> make_pbs_cluster() { return std::make_unique<PbsCluster>(); }

}  // namespace launcher
