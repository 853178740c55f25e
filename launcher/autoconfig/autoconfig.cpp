// `launcher autoconfig`; see autoconfig.hpp.
#include "launcher/autoconfig/autoconfig.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <thread>

#include "backend/common/durable_file.hpp"
#include "backend/common/error.hpp"
#include "backend/common/memory_estimate.hpp"
#include "launcher/clusters/cluster.hpp"
#include "launcher/config/compose.hpp"
#include "launcher/config/interpolate.hpp"
#include "launcher/config/node.hpp"
#include "launcher/config/scalar_text.hpp"
#include "launcher/config/sweep.hpp"
#include "launcher/config/yaml_io.hpp"
#include "launcher/launch.hpp"
#include "launcher/results_dir.hpp"
#include "launcher/run_report.hpp"
#include "launcher/run_status.hpp"
#include "launcher/stages/training_preflight.hpp"

namespace launcher {

namespace fs = std::filesystem;

namespace {

// Config names become directory and file names and override text: plain path segments only.
const std::regex kConfigName(R"([A-Za-z0-9_][A-Za-z0-9_.-]*(/[A-Za-z0-9_][A-Za-z0-9_.-]*)*)");

void check_config_name(const std::string& name, const std::string& key) {
  if (name.size() > 200 || !std::regex_match(name, kConfigName) || name.find("..") != std::string::npos) {
    common::fail("autoconfig {}={:?}: expected a config name of letters, digits, '_', '.', '-' "
                 "and '/' between them, such as gpt3/126m", key, name);
  }
}

int64_t model_integer(const Node& config, const std::string& key) {
  const Node* value = find(config, key);
  if (value == nullptr || !value->is_int() || value->as_int() < 1) {
    common::fail("autoconfig: {} of the model config must be an integer ≥ 1, got {}", key,
                 value == nullptr ? std::string("nothing") : python_str(*value));
  }
  return value->as_int();
}

// Slurm's H:MM:SS for a number of minutes, rounded up to the second.
std::string slurm_time(double minutes) {
  const auto seconds = static_cast<int64_t>(std::ceil(minutes * 60));
  return fmt::format("{}:{:02}:{:02}", seconds / 3600, seconds / 60 % 60, seconds % 60);
}

// A candidate's composed config and what the preflight says of it.
struct Checked {
  ComposedConfig composed;
  PreflightReport report;
};

Checked compose_and_check(const MainOptions& options) {
  LaunchComposition launch = compose_for_launch(options);
  const Node config = resolve(launch.composed.config, ResolveContext{launch.composed.choices});
  PreflightReport report = training_preflight(config, launch.backend->name());
  // A layout the cluster's GPUs cannot run yet is no candidate.
  for (auto& unsupported : report.unsupported) report.problems.push_back(std::move(unsupported));
  return {std::move(launch.composed), std::move(report)};
}

// The memory problem is the preflight's last and names cluster.gpu_memory_gb.
bool is_memory_problem(const std::string& problem) {
  return problem.starts_with("the estimated ") && problem.find("cluster.gpu_memory_gb") != std::string::npos;
}

// RFC 4180: a field with a comma, quote or line break is quoted, its quotes doubled.
std::string csv_field(const std::string& text) {
  if (text.find_first_of(",\"\r\n") == std::string::npos) return text;
  std::string quoted = "\"";
  for (char c : text) {
    if (c == '"') quoted += '"';
    quoted += c;
  }
  return quoted + "\"";
}

std::string gigabytes(double bytes) { return bytes > 0 ? fmt::format("{:.3f}", bytes / 1e9) : ""; }

nlohmann::json candidate_json(const CandidateResult& candidate) {
  const Layout& layout = candidate.layout;
  nlohmann::json row = {{"name", layout.name()},
                        {"tensor_parallel", layout.tensor_parallel},
                        {"pipeline_parallel", layout.pipeline_parallel},
                        {"virtual_pipeline", layout.virtual_pipeline},
                        {"data_parallel", candidate.data_parallel},
                        {"micro_batch_size", layout.micro_batch_size},
                        {"recompute", recompute_name(layout.recompute)},
                        {"distributed_optimizer", layout.distributed_optimizer},
                        {"estimated_memory_bytes", candidate.estimated_bytes},
                        {"status", candidate.status},
                        {"detail", candidate.detail}};
  if (candidate.rank > 0) {
    row["rank"] = candidate.rank;
    row["tokens_per_second"] = candidate.tokens_per_second;
    row["median_step_ms"] = candidate.median_step_ms;
  }
  if (!candidate.results_dir.empty()) row["results_dir"] = candidate.results_dir.string();
  if (!candidate.log_file.empty()) row["log_file"] = candidate.log_file.string();
  if (candidate.exit_code) row["exit_code"] = *candidate.exit_code;
  return row;
}

std::string candidates_csv(const std::vector<CandidateResult>& candidates) {
  std::string text =
      "rank,name,tp,pp,vp,dp,mbs,recompute,distributed_optimizer,estimated_memory_gb,status,"
      "tokens_per_second,median_step_ms,exit_code,detail,log_file\n";
  for (const auto& candidate : candidates) {
    const Layout& layout = candidate.layout;
    const std::vector<std::string> fields = {
        candidate.rank > 0 ? std::to_string(candidate.rank) : "",
        layout.name(),
        std::to_string(layout.tensor_parallel),
        std::to_string(layout.pipeline_parallel),
        std::to_string(layout.virtual_pipeline),
        candidate.data_parallel > 0 ? std::to_string(candidate.data_parallel) : "",
        std::to_string(layout.micro_batch_size),
        recompute_name(layout.recompute),
        layout.distributed_optimizer ? "true" : "false",
        gigabytes(candidate.estimated_bytes),
        candidate.status,
        candidate.rank > 0 ? fmt::format("{:.3f}", candidate.tokens_per_second) : "",
        candidate.rank > 0 ? fmt::format("{:.3f}", candidate.median_step_ms) : "",
        candidate.exit_code ? std::to_string(*candidate.exit_code) : "",
        candidate.detail,
        candidate.log_file.string()};
    for (size_t i = 0; i < fields.size(); ++i) {
      if (i > 0) text += ',';
      text += csv_field(fields[i]);
    }
    text += "\n";
  }
  return text;
}

// Slurm's (and launcher status') words for a job that has ended.
bool is_final_state(const std::string& state) {
  static const std::set<std::string> final_states = {
      "COMPLETED", "FAILED", "TIMEOUT", "CANCELLED", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
      "BOOT_FAIL", "DEADLINE", "SPECIAL_EXIT"};
  return final_states.contains(state.substr(0, state.find_first_of(" +")));
}

// Where a candidate's launch left its job: the last record of its results directory.
std::optional<JobRecord> last_job_record(const fs::path& results_dir) {
  std::error_code error;
  if (!fs::exists(results_dir / "jobs.jsonl", error)) return std::nullopt;
  const std::vector<JobRecord> records = read_job_records(results_dir);
  if (records.empty()) return std::nullopt;
  return records.back();
}

// A finished candidate's numbers, or why there are none.
void collect_result(CandidateResult& candidate, const fs::path& benchmark_file) {
  std::error_code error;
  if (!fs::is_regular_file(benchmark_file, error)) {
    candidate.status = "failed";
    candidate.detail = fmt::format("no {} was written; see the job log", benchmark_file.string());
    return;
  }
  try {
    const BenchmarkResult result = read_benchmark(benchmark_file);
    candidate.status = "ran";
    candidate.tokens_per_second = result.tokens_per_second;
    candidate.median_step_ms = result.median_step_ms;
    candidate.detail = fmt::format("{} on {}", benchmark_file.string(), result.device);
  } catch (const common::Error& read_error) {
    candidate.status = "failed";
    candidate.detail = read_error.what();
  }
}

// After a local launch: the job ran to its end (or its limit) already.
void settle_local(CandidateResult& candidate, const fs::path& benchmark_file) {
  const std::optional<JobRecord> record = last_job_record(candidate.results_dir);
  if (!record) {
    if (candidate.status == "launching") {
      candidate.status = "failed";
      candidate.detail = "the launch recorded no job";
    }
    return;
  }
  candidate.log_file = record->log_file;
  candidate.exit_code = record->exit_code;
  if (record->timed_out) {
    candidate.status = "timed_out";
    candidate.detail = fmt::format("stopped at max_minutes_per_run; log {}", record->log_file.string());
  } else if (record->exit_code && *record->exit_code != 0) {
    candidate.status = "failed";
    candidate.detail = fmt::format("exit status {}; log {}", *record->exit_code, record->log_file.string());
  } else {
    collect_result(candidate, benchmark_file);
  }
}

}  // namespace

void rank_candidates(std::vector<CandidateResult>& candidates) {
  auto group = [](const CandidateResult& candidate) {
    static const std::vector<std::string> order = {"ran",     "timed_out", "failed",
                                                   "unfinished", "skipped", "planned",
                                                   "does_not_fit", "preflight", "pruned"};
    const auto found = std::find(order.begin(), order.end(), candidate.status);
    return static_cast<int>(found - order.begin());
  };
  std::stable_sort(candidates.begin(), candidates.end(),
                   [&group](const CandidateResult& a, const CandidateResult& b) {
                     if (group(a) != group(b)) return group(a) < group(b);
                     if (a.status != "ran") return false;
                     if (a.tokens_per_second != b.tokens_per_second) {
                       return a.tokens_per_second > b.tokens_per_second;
                     }
                     return a.median_step_ms < b.median_step_ms;
                   });
  int rank = 0;
  for (auto& candidate : candidates) candidate.rank = candidate.status == "ran" ? ++rank : 0;
}

std::string format_candidate_table(const std::vector<CandidateResult>& candidates) {
  std::string text =
      "| rank | candidate | tp × pp × dp | vp | mbs | recompute | dist. opt. | est. memory GB | "
      "status | tokens/s | ms / step | detail |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& candidate : candidates) {
    const Layout& layout = candidate.layout;
    text += fmt::format(
        "| {} | {} | {} × {} × {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
        candidate.rank > 0 ? std::to_string(candidate.rank) : "", layout.name(),
        layout.tensor_parallel, layout.pipeline_parallel,
        candidate.data_parallel > 0 ? std::to_string(candidate.data_parallel) : "-",
        layout.virtual_pipeline, layout.micro_batch_size, recompute_name(layout.recompute),
        layout.distributed_optimizer ? "on" : "off", gigabytes(candidate.estimated_bytes),
        candidate.status, candidate.rank > 0 ? fmt::format("{:.1f}", candidate.tokens_per_second) : "",
        candidate.rank > 0 ? fmt::format("{:.1f}", candidate.median_step_ms) : "", candidate.detail);
  }
  return text;
}

int run_autoconfig(const AutoconfigOptions& options, std::ostream& terminal) {
  const fs::path conf_dir = find_conf_dir(options.conf_dir);
  std::vector<std::string> config_keys = list_groups(conf_dir);
  {
    const ComposedConfig plain = compose({conf_dir, "config", {}});
    for (const std::string& key : plain.config.keys()) config_keys.push_back(key);
  }
  SearchSettings settings = parse_search_settings(options.arguments, config_keys);
  check_config_name(settings.model, "model");
  const fs::path saved = conf_dir / "training" / (options.save_as + ".yaml");
  if (!options.save_as.empty()) {
    check_config_name(options.save_as, "--save-as");
    std::error_code error;
    if (fs::exists(saved, error)) {
      common::fail("autoconfig --save-as {}: {} exists already; choose another name",
                   options.save_as, saved.string());
    }
  }

  // What every candidate shares: the model, the cluster's shape, the user's overrides.
  std::vector<std::string> base = {"training=" + settings.model, "stages=[training]"};
  base.insert(base.end(), settings.launcher_overrides.begin(), settings.launcher_overrides.end());
  base.push_back(fmt::format("training.trainer.num_nodes={}", settings.nodes));
  base.push_back(fmt::format("training.trainer.devices={}", settings.gpus_per_node));
  if (settings.gpu_memory_gb) {
    base.push_back(fmt::format("++cluster.gpu_memory_gb={}", format_float(*settings.gpu_memory_gb)));
  }
  MainOptions main_options;
  main_options.conf_dir = conf_dir;
  main_options.overrides = base;
  main_options.dry_run = options.dry_run;
  main_options.command_line = options.command_line;
  const LaunchComposition launch = compose_for_launch(main_options);
  const Cluster& cluster = *launch.backend;
  if (cluster.autoconfig_candidate_end() == CandidateEnd::kUnsupported) {
    common::fail("autoconfig runs its candidates on the local cluster or on Slurm (cluster_type=local "
                 "or bcm), not on '{}'", cluster.name());
  }
  const Node config = resolve(launch.composed.config, ResolveContext{launch.composed.choices});
  ModelFacts model;
  model.num_layers = model_integer(config, "training.model.num_layers");
  model.num_attention_heads = model_integer(config, "training.model.num_attention_heads");
  model.global_batch_size = model_integer(config, "training.model.global_batch_size");
  const fs::path base_results_dir =
      scalar_text(at_path(config, "base_results_dir"), "base_results_dir");
  resolve_auto_lists(settings, model);
  check_search_size(settings);  // before the run directory exists

  std::string model_label = settings.model;
  std::replace(model_label.begin(), model_label.end(), '/', '_');
  const fs::path run_dir = create_unique_directory(base_results_dir / ("autoconfig_" + model_label),
                                                   "the autoconfig run directory");
  spdlog::info("autoconfig: {} on {} node(s) × {} GPU(s); results in {}", settings.model,
               settings.nodes, settings.gpus_per_node, run_dir.string());

  // Enumerate and prune. Candidates' paths reach their overrides through ${base_results_dir},
  // so no path text is ever parsed as an override value.
  const std::string run_dir_in_config =
      "${base_results_dir}/" + run_dir.lexically_relative(base_results_dir).generic_string();
  std::vector<CandidateResult> candidates;
  std::vector<std::vector<std::string>> candidate_overrides;  // parallel to candidates
  int64_t runnable = 0;
  for (const Layout& layout : enumerate_layouts(settings)) {
    CandidateResult candidate;
    candidate.layout = layout;
    std::vector<std::string> overrides = base;
    for (const std::string& item : layout.overrides()) overrides.push_back(item);
    const std::string directory = run_dir_in_config + "/candidates/" + layout.name();
    for (const std::string& item : {
             // From the checked model name, never from config text, as it is override text.
             fmt::format("training.run.name={}_{}", model_label, layout.name()),
             "training.run.results_dir=" + directory,
             "training.exp_manager.explicit_log_dir=" + directory + "/results",
             "training.run.time_limit=" + slurm_time(settings.max_minutes_per_run),
             fmt::format("training.trainer.max_steps={}", settings.max_steps_per_run),
             std::string("training.model.data.data_impl=mock"),
             std::string("training.trainer.limit_val_batches=0"),
             std::string("training.exp_manager.create_checkpoint_callback=false"),
             std::string("training.exp_manager.resume_if_exists=false")}) {
      overrides.push_back(item);
    }
    candidate.results_dir = run_dir / "candidates" / layout.name();
    // A layout that breaks a rule is not composed: its estimate would be of a layout that
    // cannot run.
    const std::optional<RuleBreak> broken = check_nemo_rules(layout, settings, model);
    std::vector<std::string> other_problems;
    bool memory_problem = false;
    double gpu_memory_bytes = 0;
    if (!broken) {
      MainOptions candidate_options = main_options;
      candidate_options.overrides = overrides;
      const Checked checked = compose_and_check(candidate_options);
      candidate.estimated_bytes = checked.report.memory.total_bytes();
      candidate.data_parallel = checked.report.data_parallel;
      gpu_memory_bytes = checked.report.gpu_memory_bytes;
      for (const std::string& problem : checked.report.problems) {
        if (is_memory_problem(problem)) {
          memory_problem = true;
        } else {
          other_problems.push_back(problem);
        }
      }
    }
    if (broken) {
      candidate.status = "pruned";
      candidate.detail = broken->rule + ": " + broken->detail;
    } else if (!other_problems.empty()) {
      candidate.status = "preflight";
      candidate.detail = fmt::format("{}", fmt::join(other_problems, "; "));
    } else if (memory_problem) {
      candidate.status = "does_not_fit";
      candidate.detail = fmt::format("estimated {} > cluster.gpu_memory_gb {} GB",
                                     common::format_gigabytes(candidate.estimated_bytes),
                                     gpu_memory_bytes / 1e9);
    } else if (runnable >= settings.limit_search_runs) {
      candidate.status = "skipped";
      candidate.detail = fmt::format("beyond limit_search_runs {}", settings.limit_search_runs);
    } else {
      ++runnable;
      candidate.status = options.dry_run ? "planned" : "launching";
    }
    candidates.push_back(std::move(candidate));
    candidate_overrides.push_back(std::move(overrides));
  }
  if (candidates.empty()) common::fail("autoconfig: the search lists give no candidates");
  spdlog::info("autoconfig: {} candidate(s), {} to run", candidates.size(), runnable);

  if (!options.dry_run && runnable > 0) {
    // One `launcher main` per candidate, as a multirun runs its jobs: the local cluster runs
    // each to its end (or its time limit); Slurm queues them all, waited for below.
    std::vector<std::vector<std::string>> jobs;
    std::vector<size_t> job_candidate;
    for (size_t i = 0; i < candidates.size(); ++i) {
      if (candidates[i].status != "launching") continue;
      jobs.push_back(candidate_overrides[i]);
      job_candidate.push_back(i);
    }
    MainOptions job_options = main_options;
    job_options.local_time_limit = std::chrono::milliseconds(
        static_cast<int64_t>(std::ceil(settings.max_minutes_per_run * 60'000)));
    auto launch_job = [&](const std::vector<std::string>& overrides, std::size_t number) {
      CandidateResult& candidate = candidates[job_candidate[number]];
      MainOptions job = job_options;
      job.overrides = overrides;
      // launch_main adds the job's launcher.log to the logger; the next job must not write there.
      struct RestoreSinks {
        std::vector<spdlog::sink_ptr> saved = spdlog::default_logger()->sinks();
        ~RestoreSinks() { spdlog::default_logger()->sinks() = saved; }
      } restore_sinks;
      try {
        const int status = launch_main(job, terminal);
        if (cluster.autoconfig_candidate_end() == CandidateEnd::kLaunchReturns) {
          settle_local(candidate, candidate.results_dir / "results" / "benchmark.json");
        }
        return status;
      } catch (const common::Error& error) {
        candidate.status = "failed";
        candidate.detail = fmt::format("the launch was refused: {}", error.what());
        throw;
      }
    };
    (void)run_sweep(jobs, launch_job, terminal);

    if (cluster.autoconfig_candidate_end() == CandidateEnd::kFinalJobState) {
      // Wait for the queued jobs: each ends by its --time, but may wait in the queue first; the
      // wait is bounded all the same, and what is left is reported as unfinished.
      const auto deadline =
          std::chrono::steady_clock::now() +
          std::chrono::milliseconds(static_cast<int64_t>(
              (settings.max_minutes_per_run + 60) * 60'000 * static_cast<double>(jobs.size())));
      std::vector<size_t> waiting;
      for (size_t index : job_candidate) {
        CandidateResult& candidate = candidates[index];
        if (candidate.status != "launching") continue;
        const std::optional<JobRecord> record = last_job_record(candidate.results_dir);
        if (!record) {
          candidate.status = "failed";
          candidate.detail = "the launch recorded no job";
          continue;
        }
        candidate.log_file = record->log_file;
        waiting.push_back(index);
      }
      spdlog::info("autoconfig: waiting for {} Slurm job(s)", waiting.size());
      while (!waiting.empty() && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::seconds(1));
        std::erase_if(waiting, [&](size_t index) {
          CandidateResult& candidate = candidates[index];
          const JobRecord record = *last_job_record(candidate.results_dir);
          const std::string state = query_job_state(record);
          if (!is_final_state(state)) return false;
          const fs::path benchmark_file = candidate.results_dir / "results" / "benchmark.json";
          if (state.starts_with("COMPLETED")) {
            collect_result(candidate, benchmark_file);
          } else if (state.starts_with("TIMEOUT")) {
            candidate.status = "timed_out";
            candidate.detail = fmt::format("Slurm job {} reached its --time; log {}", record.job_id,
                                           record.log_file.string());
          } else {
            candidate.status = "failed";
            candidate.detail = fmt::format("Slurm job {}: {}; log {}", record.job_id, state,
                                           record.log_file.string());
          }
          spdlog::info("autoconfig: {}: {}", candidate.layout.name(), candidate.status);
          return true;
        });
      }
      for (size_t index : waiting) {
        candidates[index].status = "unfinished";
        candidates[index].detail = "still queued or running when autoconfig stopped waiting";
      }
    }
  }

  rank_candidates(candidates);
  nlohmann::json table = nlohmann::json::array();
  for (const auto& candidate : candidates) table.push_back(candidate_json(candidate));
  const nlohmann::json summary = {{"model", settings.model},
                                  {"nodes", settings.nodes},
                                  {"gpus_per_node", settings.gpus_per_node},
                                  {"cluster_type", std::string(cluster.name())},
                                  {"dry_run", options.dry_run},
                                  {"max_steps_per_run", settings.max_steps_per_run},
                                  {"max_minutes_per_run", settings.max_minutes_per_run},
                                  {"candidates", table}};
  common::write_text_file_atomically(run_dir / "candidates.json", summary.dump(2) + "\n");
  common::write_text_file_atomically(run_dir / "candidates.csv", candidates_csv(candidates));
  terminal << format_candidate_table(candidates);
  terminal << fmt::format("autoconfig: table in {} and {}\n", (run_dir / "candidates.json").string(),
                          (run_dir / "candidates.csv").string());
  if (options.dry_run) return 0;

  if (candidates.empty() || candidates.front().rank != 1) {
    spdlog::error("autoconfig: no candidate ran to completion; see the table for why");
    return 1;
  }
  // The best layout on the model's own config, without the benchmark-mode settings.
  const CandidateResult& best = candidates.front();
  MainOptions best_options = main_options;
  for (const std::string& item : best.layout.overrides()) best_options.overrides.push_back(item);
  const LaunchComposition best_launch = compose_for_launch(best_options);
  const Node* training = find(best_launch.composed.config, "training");
  if (training == nullptr) common::fail("autoconfig: the composed config has no training section");
  const std::string yaml =
      fmt::format("# launcher autoconfig: the fastest of {} candidate(s) for {} on {} node(s) × {} "
                  "GPU(s): {}, {:.1f} tokens/s measured (see {})\n",
                  candidates.size(), settings.model, settings.nodes, settings.gpus_per_node,
                  best.layout.name(), best.tokens_per_second, (run_dir / "candidates.json").string()) +
      to_yaml(*training);
  const fs::path best_file = run_dir / "best" / (model_label + ".yaml");
  create_results_dir(best_file.parent_path(), "the autoconfig run directory");
  common::write_text_file_atomically(best_file, yaml);
  terminal << fmt::format("autoconfig: best {} ({:.1f} tokens/s); config {}\n", best.layout.name(),
                          best.tokens_per_second, best_file.string());
  if (!options.save_as.empty()) {
    std::error_code error;
    if (fs::exists(saved, error)) {  // written since the search started
      common::fail("autoconfig --save-as {}: {} exists already; choose another name (the best "
                   "config is in {})", options.save_as, saved.string(), best_file.string());
    }
    create_results_dir(saved.parent_path(), "autoconfig --save-as");
    common::write_text_file_atomically(saved, yaml);
    terminal << fmt::format("autoconfig: saved as training={} ({})\n", options.save_as, saved.string());
  }
  return 0;
}

}  // namespace launcher
