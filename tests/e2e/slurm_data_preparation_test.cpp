// The data_preparation stage on a real Slurm cluster (tests/e2e/slurm_test_cluster.hpp: two
// one-CPU nodes on this machine): download_and_preprocess over file:// URLs of two .jsonl.xz
// shards submits three job arrays (download: 4 tasks, decompress: 2, preprocess: 2), each after
// the one before with afterok, and Slurm runs them to .bin/.idx files. A failed download task
// makes Slurm cancel the steps after it (--kill-on-invalid-dep) instead of leaving them pending.
// Each TEST_CASE starts its own cluster; every wait is bounded.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "sanitized_build.hpp"
#include "slurm_test_cluster.hpp"
#include "temporary_directory.hpp"
#include "test_files.hpp"

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using test_support::TemporaryDirectory;

namespace {

using test_support::kGpt2Vocab;
using test_support::kGpt2Merges;

using slurm_test::submitted_job_ids;

std::string field(const std::string& record, const std::string& name) {
  const size_t at = (" " + record).find(" " + name + "=");
  if (at == std::string::npos) return {};
  const size_t start = at + name.size() + 1;
  return record.substr(start, record.find_first_of(" \n", start) - start);
}

// Two shards of a small JSONL corpus, compressed with xz; returns their paths.
std::vector<fs::path> make_shards(const fs::path& directory) {
  std::vector<fs::path> shards;
  for (int shard = 0; shard < 2; ++shard) {
    const fs::path jsonl = directory / fmt::format("shard{}.jsonl", shard);
    std::ofstream out(jsonl);
    for (int i = 0; i < 30; ++i) {
      out << fmt::format(R"({{"text": "Shard {} says hello for the {}th time, in plain English."}})", shard, i) << "\n";
    }
    out.close();
    REQUIRE(slurm_test::run_command({"xz", "--keep", jsonl.string()}, {}, 20s).exit_code == 0);
    shards.push_back(jsonl.string() + ".xz");
  }
  return shards;
}

std::vector<std::string> prepare_on_slurm(const slurm_test::SlurmTestCluster& cluster, const fs::path& root,
                                          const std::vector<fs::path>& shards) {
  std::vector<std::string> argv = {"env"};
  for (const auto& variable : cluster.environment()) argv.push_back(variable);
  const std::vector<std::string> launcher_arguments = {
      std::string(TEST_BIN_DIR) + "/launcher", "main", "stages=[data_preparation]",
      "data_preparation=gpt3/download_and_preprocess", "cluster_type=bcm", "cluster.gres=null",
      "cluster.gpus_per_node=null", "cluster.partition=debug", "cluster.exclusive=false", "cluster.mem=null",
      "base_results_dir=" + (root / "results").string(), "data_dir=" + (root / "data").string(),
      fmt::format("data_preparation.file_urls=[file://{},file://{}]", shards[0].string(), shards[1].string()),
      "data_preparation.vocab_url=file://" + kGpt2Vocab,
      "data_preparation.merges_url=file://" + kGpt2Merges,
      "data_preparation.workers=1",  // the test nodes have one CPU each
      "data_preparation.retries=0", "data_preparation.run.time_limit=0:05:00"};
  argv.insert(argv.end(), launcher_arguments.begin(), launcher_arguments.end());
  return argv;
}

}  // namespace

TEST_CASE("Slurm runs download, decompress and preprocess as job arrays chained with afterok" *
          test_support::release_only()) {
  if (!slurm_test::slurm_cluster_available()) return;  // skipped outside CI, with a message
  slurm_test::SlurmTestCluster cluster;
  TemporaryDirectory temporary;
  const std::vector<fs::path> shards = make_shards(temporary.path);
  const auto launched = slurm_test::run_command(prepare_on_slurm(cluster, temporary.path, shards), {}, 120s);
  INFO("launcher output:\n" << launched.output);
  REQUIRE(launched.exit_code == 0);

  const fs::path results = temporary.path / "results/prepare_gpt3";
  const std::vector<std::string> ids = submitted_job_ids(results / "launcher.log");
  REQUIRE(ids.size() == 3);
  const std::string preprocess_script =
      slurm_test::read_text(results / "nemo-megatron-prepare_gpt3_preprocess_submission.sh");
  CHECK(preprocess_script.find("#SBATCH --array=0-1\n") != std::string::npos);
  CHECK(preprocess_script.find("#SBATCH --dependency=afterok:" + ids[1] + ",singleton\n") != std::string::npos);

  // Every task of every array completes, each step's tasks starting after the last task of the
  // step before ended (second resolution: ISO 8601 times compare as text).
  const std::vector<int> task_counts = {4, 2, 2};
  std::string previous_step_end;
  for (size_t step = 0; step < ids.size(); ++step) {
    std::string latest_end, earliest_start = "9999";
    for (int task = 0; task < task_counts[step]; ++task) {
      const std::string task_id = fmt::format("{}_{}", ids[step], task);
      const slurm_test::JobOutcome outcome = cluster.wait_for_job(task_id, 120s);
      INFO("scontrol show job " << task_id << ": " << outcome.record);
      INFO("cluster logs:\n" << cluster.diagnostics());
      INFO("task log:\n" << slurm_test::read_text(results / fmt::format("log-nemo-megatron-prepare_gpt3_{}_{}_{}.out",
                                                                      std::vector<std::string>{"download", "decompress", "preprocess"}[step],
                                                                      ids[step], task)));
      REQUIRE(outcome.finished);
      CHECK(outcome.state == "COMPLETED");
      CHECK(outcome.exit_code == "0:0");
      latest_end = std::max(latest_end, field(outcome.record, "EndTime"));
      earliest_start = std::min(earliest_start, field(outcome.record, "StartTime"));
    }
    CHECK(earliest_start >= previous_step_end);
    previous_step_end = latest_end;
  }
  for (int shard = 0; shard < 2; ++shard) {
    for (const char* extension : {".bin", ".idx"}) {
      const fs::path output = temporary.path / fmt::format("data/meg-gpt2_0{}_text_document{}", shard, extension);
      CAPTURE(output);
      CHECK(fs::is_regular_file(output));
    }
  }
  const std::string task_log =
      slurm_test::read_text(results / fmt::format("log-nemo-megatron-prepare_gpt3_preprocess_{}_1.out", ids[2]));
  CHECK(task_log.find("text: 30 documents") != std::string::npos);
}

TEST_CASE("a failed download task makes Slurm cancel the steps after it instead of leaving them pending") {
  if (!slurm_test::slurm_cluster_available()) return;
  slurm_test::SlurmTestCluster cluster;
  TemporaryDirectory temporary;
  std::vector<fs::path> shards = make_shards(temporary.path);
  shards[1] = temporary.path / "missing.jsonl.xz";
  const auto launched = slurm_test::run_command(prepare_on_slurm(cluster, temporary.path, shards), {}, 120s);
  INFO("launcher output:\n" << launched.output);
  REQUIRE(launched.exit_code == 0);
  const fs::path results = temporary.path / "results/prepare_gpt3";
  const std::vector<std::string> ids = submitted_job_ids(results / "launcher.log");
  REQUIRE(ids.size() == 3);
  const slurm_test::JobOutcome failed = cluster.wait_for_job(ids[0] + "_1", 120s);
  INFO("download task 1: " << failed.record);
  REQUIRE(failed.finished);
  CHECK(failed.state == "FAILED");
  CHECK(slurm_test::read_text(results / fmt::format("log-nemo-megatron-prepare_gpt3_download_{}_1.out", ids[0]))
            .find("curl error 37") != std::string::npos);
  for (const std::string& later : {ids[1], ids[2]}) {
    const slurm_test::JobOutcome outcome = cluster.wait_for_job(later, 120s);
    INFO("job " << later << ": " << outcome.record << "\ncluster logs:\n" << cluster.diagnostics());
    REQUIRE(outcome.finished);
    CHECK(outcome.state == "CANCELLED");
  }
  CHECK_FALSE(fs::exists(temporary.path / "data/meg-gpt2_00_text_document.bin"));

  // `launcher status` sums up each array by task state.
  const auto status = slurm_test::run_command(
      {std::string(TEST_BIN_DIR) + "/launcher", "status", results.string()}, cluster.environment(), 30s);
  INFO("launcher status:\n" << status.output);
  CHECK(status.exit_code == 0);
  CHECK(status.output.find("data_preparation.download") != std::string::npos);
  CHECK(status.output.find("COMPLETED ×3, FAILED (exit 2:0) ×1") != std::string::npos);
  CHECK(status.output.find("CANCELLED") != std::string::npos);
}
