// The "Drop-in for NeMo users" issue on the real Slurm test cluster (slurm_test_cluster.hpp: two
// one-CPU slurmd on this machine): `launcher main --config-dir <NeMo 23.07's conf>` with NeMo's
// cluster/bcm.yaml, its download_gpt3_pile and its gpt3/126m. The overrides are the site's (the
// test nodes have no GPUs and no pyxis, and no network: the Pile and GPT-2's files come from
// file:// URLs), the run's size, and the data blend of the two shards downloaded. Slurm runs
// the download, extract and preprocess arrays and then the training, each after the one before;
// and NeMo 23.08.02's llama/llama2_7b trains there with its SentencePiece settings (mock data).
// Each TEST_CASE starts its own cluster; every wait is bounded.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "mpi_test_environment.hpp"
#include "sanitized_build.hpp"
#include "slurm_test_cluster.hpp"
#include "temporary_directory.hpp"
#include "test_files.hpp"

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using test_support::TemporaryDirectory;

namespace {

using test_support::kSourceDir;

// `launcher main` from NeMo's own tree (23.07's unless told), with the cluster's environment and `extra`.
std::vector<std::string> nemo_tree_launch(const slurm_test::SlurmTestCluster& cluster, const fs::path& root,
                                          const std::vector<std::string>& extra,
                                          const std::string& tree = "nemo_23.07",
                                          const std::string& training = "gpt3/126m") {
  std::vector<std::string> argv = {"env"};
  for (const auto& variable : cluster.environment()) argv.push_back(variable);
  for (const auto& variable : test_support::mpi_test_environment()) argv.push_back(variable);
  const std::vector<std::string> launcher_arguments = {
      std::string(TEST_BIN_DIR) + "/launcher", "main", "--config-dir",
      (kSourceDir / "tests/data" / tree / "conf").string(), "training=" + training,
      "launcher_scripts_path=" + (root / "launcher_scripts").string(),
      "data_dir=" + (root / "data").string(), "base_results_dir=" + (root / "results").string(),
      // The site: nodes without GPUs (NeMo's bcm.yaml asks for 8 per node).
      "cluster.gpus_per_node=null"};
  argv.insert(argv.end(), launcher_arguments.begin(), launcher_arguments.end());
  argv.insert(argv.end(), extra.begin(), extra.end());
  fs::create_directories(root / "launcher_scripts");
  return argv;
}

using slurm_test::submitted_job_ids;

}  // namespace

TEST_CASE(
    "NeMo's container on a cluster without pyxis is refused before anything is written or queued" *
    test_support::release_only()) {
  if (!slurm_test::slurm_cluster_available()) return;  // skipped outside CI, with a message
  slurm_test::SlurmTestCluster cluster;
  TemporaryDirectory temporary;
  const auto launched =
      slurm_test::run_command(nemo_tree_launch(cluster, temporary.path, {"stages=[training]"}), {}, 120s);
  INFO("launcher output:\n" << launched.output);
  CHECK(launched.exit_code == 2);
  CHECK(launched.output.find("container is \"nvcr.io/ea-bignlp/nemofw-training:23.07-py3\", but this "
                             "cluster's srun has no pyxis plugin") != std::string::npos);
  CHECK(launched.output.find("set container=null") != std::string::npos);
  CHECK_FALSE(fs::exists(temporary.path / "results"));
  const auto queue = cluster.client("squeue", {"-h", "-o", "%i %j"});
  CHECK(queue.exit_code == 0);
  CHECK(queue.output.find_first_not_of(" \n") == std::string::npos);
}

TEST_CASE(
    "NeMo 23.07's tree on Slurm: download_gpt3_pile over file:// shards, then gpt3/126m trains on "
    "them" *
    test_support::release_only()) {
  if (!slurm_test::slurm_cluster_available()) return;  // skipped outside CI, with a message
  slurm_test::SlurmTestCluster cluster;
  TemporaryDirectory temporary;
  const fs::path pile = temporary.path / "pile";  // the_pile_url's directory: 00.jsonl.zst, 01.jsonl.zst
  fs::create_directories(pile);
  for (int shard = 0; shard < 2; ++shard) {
    const fs::path jsonl = temporary.path / fmt::format("{:02d}.jsonl", shard);
    std::ofstream out(jsonl);
    // Enough documents that NeMo's split (99990,8,2) leaves the validation and test splits one or
    // more: Megatron rounds each boundary half to even, and 0.00002 × 26000 = 0.52 documents.
    for (int document = 0; document < 26000; ++document) {
      out << fmt::format(R"({{"text": "Pile shard {} document {}: the quick brown fox jumps over the lazy dog.", )"
                         R"("meta": {{"pile_set_name": "Pile-CC"}}}})",
                         shard, document)
          << "\n";
    }
    out.close();
    const auto zstd = slurm_test::run_command(
        {"zstd", "-q", "-f", jsonl.string(), "-o", (pile / fmt::format("{:02d}.jsonl.zst", shard)).string()}, {},
        20s);
    REQUIRE_MESSAGE(zstd.exit_code == 0, "zstd (Debian: zstd) failed: " << zstd.output);
  }
  const std::string data = (temporary.path / "data").string();
  const auto launched = slurm_test::run_command(
      nemo_tree_launch(
          cluster, temporary.path,
          {"stages=[data_preparation,training]", "container=null",
           // No network here: the Pile and GPT-2's files from file:// URLs, two of the 30 shards.
           "data_preparation.the_pile_url=file://" + pile.string() + "/", "data_preparation.file_numbers=0-1",
           "data_preparation.download_vocab_url=file://" + (kSourceDir / "tests/data/gpt2-vocab.json").string(),
           "data_preparation.download_merges_url=file://" + (kSourceDir / "tests/data/gpt2-merges.txt").string(),
           "training.model.data.data_prefix=[0.5," + data + "/my-gpt3_00_text_document,0.5," + data +
               "/my-gpt3_01_text_document]",
           // Size: one CPU process, a model and run small enough for a test.
           "training.trainer.num_nodes=1", "training.trainer.devices=1", "training.trainer.max_steps=3", "training.trainer.val_check_interval=3",
           "training.trainer.limit_val_batches=1", "training.trainer.log_every_n_steps=1",
           "training.model.micro_batch_size=2", "training.model.global_batch_size=4",
           "training.model.num_layers=2", "training.model.hidden_size=64", "training.model.num_attention_heads=4",
           "training.model.encoder_seq_length=32", "training.model.max_position_embeddings=32",
           "training.model.data.seq_length=32"}),
      {}, 120s);
  INFO("launcher output:\n" << launched.output);
  REQUIRE(launched.exit_code == 0);
  // NeMo's bcm.yaml lists --no-container-mount-home in srun_args; without a container it is
  // left out, or srun (no pyxis here) would refuse every step.
  CHECK(launched.output.find("--no-container-mount-home is pyxis's and there is no container") !=
        std::string::npos);
  CHECK(launched.output.find("pyxis's") == launched.output.rfind("pyxis's"));  // said once

  const fs::path preparation = temporary.path / "results" / "download_gpt3_pile";
  const fs::path training = temporary.path / "results" / "gpt3_126m";
  const auto preparation_ids = submitted_job_ids(preparation / "launcher.log");
  const auto training_ids = submitted_job_ids(training / "launcher.log");
  // download, extract, preprocess (arrays of two tasks), then the training, whose submission
  // this log has too: the launcher logs to every results directory it has opened.
  REQUIRE(preparation_ids.size() == 4);
  REQUIRE(training_ids == std::vector<std::string>{preparation_ids[3]});
  const std::string script =
      slurm_test::read_text(training / "nemo-megatron-gpt3_126m_submission.sh");
  CHECK(script.find("#SBATCH --dependency=afterok:" + preparation_ids[2] + ",singleton\n") !=
        std::string::npos);
  CHECK(script.find("container") == std::string::npos);

  const slurm_test::JobOutcome outcome = cluster.wait_for_job(training_ids.front(), 240s);
  const fs::path job_log = training / ("log-nemo-megatron-gpt3_126m_" + training_ids.front() + ".out");
  INFO("scontrol show job: " << outcome.record);
  INFO("job log:\n" << slurm_test::read_text(job_log));
  // NeMo's bcm.yaml keeps the job's stderr apart (no stderr_to_stdout).
  INFO("job errors:\n" << slurm_test::read_text(fs::path(job_log).replace_extension(".err")));
  INFO("cluster logs:\n" << cluster.diagnostics());
  REQUIRE(outcome.finished);
  CHECK(outcome.state == "COMPLETED");
  for (int shard = 0; shard < 2; ++shard) {
    for (const char* extension : {".bin", ".idx"}) {
      CHECK(fs::is_regular_file(fmt::format("{}/my-gpt3_{:02d}_text_document{}", data, shard, extension)));
    }
  }
  const std::string log = slurm_test::read_text(job_log);
  static const std::regex kIteration(R"( iteration +\d+/ +3 \| consumed samples: +\d+ \|)");
  CHECK(std::distance(std::sregex_iterator(log.begin(), log.end(), kIteration), std::sregex_iterator()) == 3);
  // NeMo's blend reached the backend as its data path, with NeMo's tokenizer files.
  CHECK(script.find("--data-path 0.5 " + data + "/my-gpt3_00_text_document 0.5 " + data +
                    "/my-gpt3_01_text_document") != std::string::npos);
  CHECK(script.find("--vocab-file " + data + "/bpe/vocab.json") != std::string::npos);
}

TEST_CASE(
    "NeMo 23.08.02's llama/llama2_7b trains on Slurm with its SentencePiece tokenizer and size "
    "overrides" *
    test_support::release_only()) {
  if (!slurm_test::slurm_cluster_available()) return;  // skipped outside CI, with a message
  slurm_test::SlurmTestCluster cluster;
  TemporaryDirectory temporary;
  // NeMo's llama2_7b reads ${data_dir}/llama/llama_tokenizer.model: the test's small model.
  fs::create_directories(temporary.path / "data" / "llama");
  fs::copy_file(kSourceDir / "tests/data/sentencepiece_bpe.model", temporary.path / "data/llama/llama_tokenizer.model");
  const auto launched = slurm_test::run_command(
      nemo_tree_launch(cluster, temporary.path,
                       {"stages=[training]", "container=null", "training.trainer.num_nodes=1",
                        "training.trainer.devices=1", "training.trainer.max_steps=3",
                        "training.trainer.val_check_interval=3", "training.trainer.limit_val_batches=1",
                        "training.trainer.log_every_n_steps=1", "training.model.micro_batch_size=2",
                        "training.model.global_batch_size=4", "training.model.tensor_model_parallel_size=1",
                        "training.model.pipeline_model_parallel_size=1", "training.model.num_layers=2",
                        "training.model.hidden_size=64", "training.model.ffn_hidden_size=128",
                        "training.model.num_attention_heads=4", "training.model.encoder_seq_length=32",
                        "training.model.max_position_embeddings=32", "training.model.data.seq_length=32",
                        // No Pile here: NeMo's llama2_7b names 30 shards it has no stage to make.
                        "training.model.data.data_impl=mock"},
                       "nemo_23.08.02", "llama/llama2_7b"),
      {}, 120s);
  INFO("launcher output:\n" << launched.output);
  REQUIRE(launched.exit_code == 0);
  const fs::path training = temporary.path / "results" / "llama2_7b";
  const auto job_ids = submitted_job_ids(training / "launcher.log");
  REQUIRE(job_ids.size() == 1);
  const slurm_test::JobOutcome outcome = cluster.wait_for_job(job_ids.front(), 240s);
  const fs::path job_log = training / ("log-nemo-megatron-llama2_7b_" + job_ids.front() + ".out");
  INFO("scontrol show job: " << outcome.record);
  INFO("job log:\n" << slurm_test::read_text(job_log));
  INFO("job errors:\n" << slurm_test::read_text(fs::path(job_log).replace_extension(".err")));
  REQUIRE(outcome.finished);
  CHECK(outcome.state == "COMPLETED");
  const std::string log = slurm_test::read_text(job_log);
  static const std::regex kIteration(R"( iteration +\d+/ +3 \| consumed samples: +\d+ \|)");
  CHECK(std::distance(std::sregex_iterator(log.begin(), log.end(), kIteration), std::sregex_iterator()) == 3);
  CHECK(log.find("tokenizer_type .................................. GPTSentencePieceTokenizer") !=
        std::string::npos);
}
