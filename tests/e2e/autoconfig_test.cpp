// End to end: `launcher autoconfig` runs a tiny model's candidates as real benchmark-mode
// pretrain_gpt runs, on the local cluster (mpirun, 2 ranks) and on the test Slurm cluster, and
// ranks them by the tokens/s their benchmark.json files report. A candidate is made to fail (or
// to hang past max_minutes_per_run) deterministically by a pretrain_gpt wrapper placed in
// backend_bin_dir, which runs the real one for every other layout.
#include <doctest/doctest.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "launcher/process.hpp"
#include "launcher/shell_quote.hpp"
#include "mpi_test_environment.hpp"
#include "sanitized_build.hpp"
#include "slurm_test_cluster.hpp"
#include "temporary_directory.hpp"
#include "test_files.hpp"

namespace fs = std::filesystem;
using namespace std::chrono_literals;

namespace {

using test_support::read_file;
using test_support::TemporaryDirectory;

// backend_bin_dir with a pretrain_gpt that does `action` when its arguments hold every one of
// `when`, and runs the real pretrain_gpt otherwise.
fs::path wrapped_backend(const fs::path& directory, const std::vector<std::string>& when,
                         const std::string& action) {
  fs::create_directories(directory);
  std::string condition = "true";
  for (const std::string& flag : when) condition += " && [[ \" $* \" == *\" " + flag + " \"* ]]";
  std::ofstream script(directory / "pretrain_gpt");
  script << "#!/usr/bin/env bash\n"
         << "if " << condition << "; then " << action << "; fi\n"
         << "exec " << TEST_BIN_DIR << "/pretrain_gpt \"$@\"\n";
  script.close();
  fs::permissions(directory / "pretrain_gpt", fs::perms::owner_all);
  return directory;
}

// The tiny model of launcher_main_test.cpp, searched over the given lists.
std::vector<std::string> tiny_search(const fs::path& results, const fs::path& bin_dir,
                                     std::vector<std::string> extra) {
  std::vector<std::string> argv = {
      "model=gpt3/126m", "cluster.gpu_memory_gb=8", "pipeline_parallel_sizes=[1]",
      "recompute=[none]", "distributed_optimizer=[false]", "max_steps_per_run=3",
      "base_results_dir=" + results.string(), "backend_bin_dir=" + bin_dir.string(),
      "training.model.global_batch_size=4", "training.model.encoder_seq_length=32",
      "training.model.num_layers=2", "training.model.hidden_size=64",
      "training.model.num_attention_heads=4"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

std::vector<std::string> local_autoconfig(const std::vector<std::string>& arguments) {
  std::vector<std::string> argv = {std::string(TEST_BIN_DIR) + "/launcher", "autoconfig"};
  argv.insert(argv.end(), arguments.begin(), arguments.end());
  return argv;
}

nlohmann::json candidates_of(const fs::path& run_dir) {
  return nlohmann::json::parse(read_file(run_dir / "candidates.json")).at("candidates");
}

const nlohmann::json& candidate_named(const nlohmann::json& candidates, const std::string& name) {
  for (const auto& candidate : candidates) {
    if (candidate.at("name") == name) return candidate;
  }
  FAIL("no candidate " << name);
  throw std::logic_error("unreachable");
}

// Ranks 1..n in table order, each with the tokens/s its own benchmark.json reports, descending.
void check_ranking_matches_measurements(const nlohmann::json& candidates, size_t expected_ran) {
  std::vector<double> measured;
  for (const auto& candidate : candidates) {
    if (candidate.at("status") != "ran") continue;
    CAPTURE(candidate.dump());
    CHECK(candidate.at("rank").get<size_t>() == measured.size() + 1);
    const nlohmann::json report = nlohmann::json::parse(
        read_file(fs::path(candidate.at("results_dir").get<std::string>()) / "results" / "benchmark.json"));
    const double tokens = report.at("tokens_per_second").get<double>();
    CHECK(tokens > 0);
    CHECK(candidate.at("tokens_per_second").get<double>() == doctest::Approx(tokens));
    CHECK(candidate.at("median_step_ms").get<double>() ==
          doctest::Approx(report.at("median_step_ms").get<double>()));
    if (!measured.empty()) CHECK(tokens <= measured.back());
    measured.push_back(tokens);
  }
  CHECK(measured.size() == expected_ran);
}

const std::string kFailing = "tp2_pp1_vp1_mbs2_recompute-none_distopt-off";

}  // namespace

TEST_CASE(
    "autoconfig on the local cluster: 4 candidates, one failing, the rest ranked by tokens/s" *
    test_support::release_only()) {
  test_support::use_mpi_test_environment();
  TemporaryDirectory temporary;
  // A copy of conf/, for --save-as to write into.
  const fs::path conf = temporary.path / "conf";
  fs::copy(fs::path(TEST_SOURCE_DIR) / "conf", conf, fs::copy_options::recursive);
  const fs::path bin = wrapped_backend(temporary.path / "bin",
                                       {"--tensor-model-parallel-size 2", "--micro-batch-size 2"},
                                       "echo 'forced failure' >&2; exit 3");
  std::vector<std::string> argv = local_autoconfig(tiny_search(
      temporary.path / "results", bin,
      {"cluster.gpus_per_node=2", "tensor_parallel_sizes=[1,2]", "micro_batch_sizes=[1,2]",
       "max_minutes_per_run=2", "cluster_type=local"}));
  argv.insert(argv.end(), {"--config-dir", conf.string(), "--save-as", "autoconfig/tiny_best"});
  const auto run = launcher::run_and_capture(argv);
  INFO(run.output);
  REQUIRE(run.exit_code == 0);

  const fs::path run_dir = temporary.path / "results" / "autoconfig_gpt3_126m";
  const nlohmann::json candidates = candidates_of(run_dir);
  REQUIRE(candidates.size() == 4);
  check_ranking_matches_measurements(candidates, 3);
  const nlohmann::json& failed = candidate_named(candidates, kFailing);
  CHECK(failed.at("status") == "failed");
  CHECK(failed.at("exit_code").get<int>() != 0);
  CHECK(candidates.back().at("name") == kFailing);  // after every ranked one
  CHECK(read_file(failed.at("log_file").get<std::string>()).find("forced failure") != std::string::npos);
  // Each candidate ran as the layout it names, in its own results directory.
  const nlohmann::json& best = candidates.front();
  const std::string script = read_file(fs::path(best.at("results_dir").get<std::string>()) /
                                       ("gpt3_126m_" + best.at("name").get<std::string>() +
                                        "_submission.sh"));
  CHECK(script.find("--micro-batch-size " + std::to_string(best.at("micro_batch_size").get<int>())) !=
        std::string::npos);
  CHECK(script.find("--train-iters 3") != std::string::npos);
  CHECK(script.find("--benchmark-output") != std::string::npos);
  CHECK(run.output.find("| 1 | " + best.at("name").get<std::string>() + " |") != std::string::npos);

  // The best config: the model's own config with the winning layout, no benchmark settings.
  const std::string best_yaml = read_file(run_dir / "best" / "gpt3_126m.yaml");
  CHECK(best_yaml.find("tensor_model_parallel_size: " +
                       std::to_string(best.at("tensor_parallel").get<int>())) != std::string::npos);
  CHECK(best_yaml.find("micro_batch_size: " + std::to_string(best.at("micro_batch_size").get<int>())) !=
        std::string::npos);
  CHECK(best_yaml.find("devices: 2") != std::string::npos);
  CHECK(best_yaml.find("max_steps: 600000") != std::string::npos);  // the model's, not 3
  CHECK(best_yaml.find("candidates/") == std::string::npos);         // its own results dirs
  CHECK(best_yaml.find("limit_val_batches: 0\n") == std::string::npos);
  // Saved into the conf tree, it is a training config `launcher main` composes.
  CHECK(read_file(conf / "training" / "autoconfig" / "tiny_best.yaml") == best_yaml);
  const auto shown = launcher::run_and_capture(
      {std::string(TEST_BIN_DIR) + "/launcher", "main", "--config-dir", conf.string(),
       "training=autoconfig/tiny_best", "--cfg", "job", "--package", "training.model"});
  INFO(shown.output);
  CHECK(shown.exit_code == 0);
  CHECK(shown.output.find("micro_batch_size: " + std::to_string(best.at("micro_batch_size").get<int>())) !=
        std::string::npos);
}

TEST_CASE(
    "autoconfig on the local cluster stops a candidate past max_minutes_per_run and ranks the "
    "rest" *
    test_support::release_only()) {
  test_support::use_mpi_test_environment();
  TemporaryDirectory temporary;
  const fs::path bin = wrapped_backend(temporary.path / "bin", {"--micro-batch-size 2"},
                                       "exec sleep 300");
  const auto started = std::chrono::steady_clock::now();
  // One rank each (no mpirun start-up), so the candidate that runs is well inside the limit.
  const auto run = launcher::run_and_capture(local_autoconfig(tiny_search(
      temporary.path / "results", bin,
      {"cluster.gpus_per_node=1", "tensor_parallel_sizes=[1]", "micro_batch_sizes=[1,2]",
       "max_minutes_per_run=0.2", "cluster_type=local"})));
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  CHECK(std::chrono::steady_clock::now() - started < 60s);  // the sleeper did not run its 300 s
  const nlohmann::json candidates = candidates_of(temporary.path / "results" / "autoconfig_gpt3_126m");
  REQUIRE(candidates.size() == 2);
  check_ranking_matches_measurements(candidates, 1);
  const nlohmann::json& stopped = candidate_named(candidates, "tp1_pp1_vp1_mbs2_recompute-none_distopt-off");
  CHECK(stopped.at("status") == "timed_out");
  CHECK(stopped.at("detail").get<std::string>().find("max_minutes_per_run") != std::string::npos);
  const std::string records = read_file(fs::path(stopped.at("results_dir").get<std::string>()) / "jobs.jsonl");
  CHECK(records.find("\"timed_out\":true") != std::string::npos);
}

TEST_CASE("Ctrl-C during a local autoconfig candidate stops it and the search") {
  // Candidates with a time limit run in a process group of their own, out of the terminal's
  // reach: the launcher passes the SIGINT on, records the job, and ends by the same signal.
  test_support::use_mpi_test_environment();
  TemporaryDirectory temporary;
  const fs::path sleepers = temporary.path / "sleepers";
  const fs::path bin = wrapped_backend(temporary.path / "bin", {},
                                       "echo $$ >>" + launcher::shell_quote(sleepers.string()) +
                                           "; exec sleep 300");
  const std::string command = launcher::shell_join(local_autoconfig(tiny_search(
      temporary.path / "results", bin,
      {"cluster.gpus_per_node=1", "tensor_parallel_sizes=[1]", "micro_batch_sizes=[1,2]",
       "max_minutes_per_run=5", "cluster_type=local"})));
  // set -m: the launcher runs as a job of its own with SIGINT not ignored, as from a terminal.
  const std::string script =
      "set -m\n" + command + " >" +
      launcher::shell_quote((temporary.path / "launcher.out").string()) + " 2>&1 &\n"
      "launcher=$!\n"
      "for i in $(seq 600); do [[ -s " + launcher::shell_quote(sleepers.string()) +
      " ]] && break; sleep 0.1; done\n"
      "sleep 0.5\n"
      "kill -INT $launcher\n"
      "wait $launcher\n"
      "echo \"launcher exit $?\"\n";
  // Inherited by bash and the launcher: a suite started in the background by a non-interactive
  // shell has SIGINT ignored, which the launcher respects (nohup) and bash cannot undo.
  std::signal(SIGINT, SIG_DFL);
  const auto started = std::chrono::steady_clock::now();
  const auto run = launcher::run_and_capture({"bash", "-c", script});
  const std::string launcher_output = read_file(temporary.path / "launcher.out");
  INFO(run.output);
  INFO(launcher_output);
  CHECK(run.output.find("launcher exit 130") != std::string::npos);  // 128 + SIGINT
  CHECK(std::chrono::steady_clock::now() - started < 120s);
  CHECK(launcher_output.find("stopped by SIGINT") != std::string::npos);
  // One candidate started, and its process is gone (or a zombie awaiting its reaper).
  const std::string pids = read_file(sleepers);
  REQUIRE(std::count(pids.begin(), pids.end(), '\n') == 1);
  const std::string pid = pids.substr(0, pids.size() - 1);
  const fs::path stat = fs::path("/proc") / pid / "stat";
  if (fs::exists(stat)) CHECK(read_file(stat).find(") Z ") != std::string::npos);
  // Its job record is kept.
  bool recorded = false;
  for (const auto& entry : fs::recursive_directory_iterator(temporary.path / "results")) {
    if (entry.path().filename() == "jobs.jsonl") recorded = true;
  }
  CHECK(recorded);
}

TEST_CASE("autoconfig with bad settings says what is wrong and runs nothing") {
  TemporaryDirectory temporary;
  const auto run = launcher::run_and_capture(local_autoconfig(
      {"model=gpt3/126m", "micro_batch_size=[1,2]", "base_results_dir=" + temporary.path.string()}));
  CHECK(run.exit_code == 2);
  CHECK(run.output.find("unknown key 'micro_batch_size'") != std::string::npos);
  CHECK(run.output.find("Did you mean 'micro_batch_sizes'?") != std::string::npos);
  CHECK(fs::is_empty(temporary.path));
}

TEST_CASE("autoconfig on the test Slurm cluster: one job per candidate, a failed one reported" *
          test_support::release_only()) {
  if (!slurm_test::slurm_cluster_available()) return;  // skipped outside CI, with a message
  slurm_test::SlurmTestCluster cluster;
  TemporaryDirectory temporary;
  const fs::path bin = wrapped_backend(temporary.path / "bin", {"--tensor-model-parallel-size 2"},
                                       "echo 'forced failure' >&2; exit 3");
  std::vector<std::string> argv = {"env"};
  for (const std::string& variable : cluster.environment()) argv.push_back(variable);
  for (const std::string& variable : test_support::mpi_test_environment()) argv.push_back(variable);
  argv.insert(argv.end(), {std::string(TEST_BIN_DIR) + "/launcher", "autoconfig"});
  // Two one-CPU nodes: two ranks, one per node, joined by srun's PMIx.
  for (const std::string& argument : tiny_search(
           temporary.path / "results", bin,
           {"cluster.nodes=2", "cluster.gpus_per_node=1", "tensor_parallel_sizes=[1,2]",
            "micro_batch_sizes=[2]", "max_minutes_per_run=2", "cluster_type=bcm",
            // The scheduler's GPU request is the cluster config's own key, which autoconfig's
            // cluster.gpus_per_node (the devices per node searched over) leaves alone.
            "cluster.gres=null", "++cluster.gpus_per_node=null", "cluster.partition=debug",
            "cluster.exclusive=false", "cluster.mem=null", "cluster.srun_args=['--mpi=pmix']"})) {
    argv.push_back(argument);
  }
  const auto run = slurm_test::run_command(argv, {}, 240s);
  INFO("launcher output:\n" << run.output);
  INFO("cluster logs:\n" << cluster.diagnostics());
  REQUIRE(run.exit_code == 0);
  const nlohmann::json candidates = candidates_of(temporary.path / "results" / "autoconfig_gpt3_126m");
  REQUIRE(candidates.size() == 2);
  check_ranking_matches_measurements(candidates, 1);
  const nlohmann::json& failed = candidate_named(candidates, "tp2_pp1_vp1_mbs2_recompute-none_distopt-off");
  CHECK(failed.at("status") == "failed");
  CHECK(failed.at("detail").get<std::string>().find("FAILED") != std::string::npos);
  // Each candidate was its own job, with max_minutes_per_run as its --time.
  const fs::path ran_dir = candidates.front().at("results_dir").get<std::string>();
  const std::string script = read_file(
      ran_dir / ("nemo-megatron-gpt3_126m_" + candidates.front().at("name").get<std::string>() +
                 "_submission.sh"));
  CHECK(script.find("#SBATCH --time=0:02:00\n") != std::string::npos);
  CHECK(script.find("#SBATCH --nodes=2\n") != std::string::npos);
}
