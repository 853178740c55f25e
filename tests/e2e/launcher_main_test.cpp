// End to end: the real `launcher` binary composes conf/, renders the local script, runs the
// real `pretrain_gpt` and leaves NeMo's results layout. Tiny model overrides keep it fast.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "iteration_lines.hpp"
#include "launcher/process.hpp"
#include "launcher/run_status.hpp"
#include "logged_losses.hpp"
#include "mpi_test_environment.hpp"
#include "sanitized_build.hpp"
#include "temporary_directory.hpp"
#include "test_files.hpp"

namespace fs = std::filesystem;

namespace {

using test_support::count_matches;
using test_support::kIterationLine;

using test_support::read_file;
using test_support::TemporaryDirectory;

std::vector<std::string> tiny_run(const fs::path& results, std::vector<std::string> extra = {}) {
  std::vector<std::string> argv = {
      std::string(TEST_BIN_DIR) + "/launcher", "main", "training=gpt3/126m", "cluster_type=local",
      "base_results_dir=" + results.string(), "training.trainer.max_steps=3",
      "training.model.global_batch_size=4", "training.model.micro_batch_size=2",
      "training.model.encoder_seq_length=32", "training.model.num_layers=2",
      "training.model.hidden_size=64", "training.model.num_attention_heads=4",
      "training.trainer.limit_val_batches=1"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}


}  // namespace

TEST_CASE("launcher main runs a tiny gpt3/126m to completion and leaves NeMo's results layout") {
  TemporaryDirectory temporary;
  const auto run = launcher::run_and_capture(tiny_run(temporary.path));
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  const fs::path results = temporary.path / "gpt3_126m";
  CHECK(fs::is_regular_file(results / "gpt3_126m_hydra.yaml"));
  CHECK(fs::is_regular_file(results / "launcher_cmd.log"));
  CHECK(fs::is_regular_file(results / "launcher.log"));
  CHECK(fs::is_regular_file(results / "gpt3_126m_submission.sh"));
  std::vector<fs::path> job_logs;
  for (const auto& entry : fs::directory_iterator(results)) {
    if (entry.path().filename().string().starts_with("log-gpt3_126m_")) job_logs.push_back(entry.path());
  }
  REQUIRE(job_logs.size() == 1);
  const std::string job_log = read_file(job_logs[0]);
  CHECK(count_matches(job_log, kIterationLine) == 3);
  CHECK(job_log.find(" validation loss at iteration 3 on validation set | lm loss value: ") !=
        std::string::npos);
  // The same lines reached the terminal, and the launcher said which cluster it used.
  CHECK(count_matches(run.output, kIterationLine) == 3);

  const std::string resolved = read_file(results / "gpt3_126m_hydra.yaml");
  CHECK(resolved.find("${") == std::string::npos);  // fully resolved
  CHECK(resolved.find("num_layers: 2") != std::string::npos);
  CHECK(resolved.find("ffn_hidden_size: 256") != std::string::npos);  // ${multiply:4, ${.hidden_size}}
  CHECK(read_file(results / "launcher_cmd.log").find("training.trainer.max_steps=3") !=
        std::string::npos);
  const std::string script = read_file(results / "gpt3_126m_submission.sh");
  for (const char* flag : {"--num-layers 2", "--hidden-size 64", "--num-attention-heads 4",
                           "--seq-length 32", "--max-position-embeddings 32",
                           "--micro-batch-size 2", "--global-batch-size 4", "--train-iters 3",
                           "--lr 0.0006", "--min-lr 6e-05", "--lr-decay-style cosine",
                           "--mock-data", "--seed 1234", "--eval-iters 1"}) {
    CAPTURE(flag);
    CHECK(script.find(flag) != std::string::npos);
  }
  CHECK(read_file(results / "launcher.log").find("local job") != std::string::npos);

  // NeMo's log dir (exp_manager.explicit_log_dir = <results>/results): the backend's
  // cmd-args.log and hparams.yaml, and the TensorBoard event file.
  CHECK(read_file(results / "results" / "cmd-args.log").find("pretrain_gpt --num-layers 2 ") !=
        std::string::npos);
  CHECK(read_file(results / "results" / "hparams.yaml").find("\nnum_layers: 2\n") != std::string::npos);
  int event_files = 0;
  for (const auto& entry : fs::directory_iterator(results / "results")) {
    event_files += entry.path().filename().string().starts_with("events.out.tfevents.") ? 1 : 0;
  }
  CHECK(event_files == 1);
}

namespace {

// A tiny Llama 2 run through `launcher main` with mock data: the config's own Llama2Tokenizer,
// with the test SentencePiece model (500 pieces, padded to 512) in place of Llama's.
launcher::CapturedRun tiny_llama_run(const fs::path& results, const std::string& training,
                                     std::vector<std::string> extra = {}) {
  std::vector<std::string> argv = {
      std::string(TEST_BIN_DIR) + "/launcher", "main", "training=" + training,
      "cluster_type=local", "base_results_dir=" + results.string(),
      "training.trainer.num_nodes=1", "training.trainer.devices=1",
      "training.trainer.max_steps=3", "training.trainer.limit_val_batches=1",
      "training.trainer.log_every_n_steps=1",
      "training.model.global_batch_size=4", "training.model.micro_batch_size=2",
      "training.model.encoder_seq_length=32", "training.model.num_layers=2",
      "training.model.hidden_size=64", "training.model.num_attention_heads=4",
      "training.model.ffn_hidden_size=128",
      "training.model.tokenizer.model=" + std::string(TEST_SOURCE_DIR) +
          "/tests/data/sentencepiece_bpe.model"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return launcher::run_and_capture(argv);
}

}  // namespace

TEST_CASE("launcher main trains a tiny llama2_7b: the Llama flags reach pretrain_gpt") {
  TemporaryDirectory temporary;
  const auto run = tiny_llama_run(temporary.path, "llama/llama2_7b");
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  CHECK(count_matches(run.output, kIterationLine) == 3);
  const std::string script =
      read_file(temporary.path / "llama2_7b" / "llama2_7b_submission.sh");
  for (const char* flag :
       {"--position-embedding-type rope", "--normalization RMSNorm", "--swiglu",
        "--disable-bias-linear", "--untie-embeddings-and-output-weights", "--rotary-base 10000",
        "--ffn-hidden-size 128"}) {
    CAPTURE(flag);
    CHECK(script.find(flag) != std::string::npos);
  }
  CHECK(script.find("--group-query-attention") == std::string::npos);
  // NeMo's llama2_7b: no recompute (granularity null, whatever method and num_layers say), and
  // NeMo's SentencePiece tokenizer (library sentencepiece, type null), which adds no BOS.
  CHECK(script.find("--recompute-") == std::string::npos);
  CHECK(script.find("--tokenizer-type GPTSentencePieceTokenizer") != std::string::npos);
  CHECK(script.find("/tests/data/sentencepiece_bpe.model") != std::string::npos);
  CHECK(run.output.find(" > padded vocab (size: 500) with 12 dummy tokens (new size: 512)") !=
        std::string::npos);
  // 2 layers of 4·64² (attention) + 3·64·128 (SwiGLU) + 2·64 (norms), the word embedding and
  // the output layer (512 × 64 each), the final norm.
  CHECK(run.output.find("model parallel rank (0, 0): 147776") != std::string::npos);
}

TEST_CASE("launcher main trains a tiny llama2_70b with grouped-query attention") {
  TemporaryDirectory temporary;
  const auto run = tiny_llama_run(
      temporary.path, "llama/llama2_70b",
      {"training.model.num_query_groups=2", "training.model.tensor_model_parallel_size=1",
       "training.model.pipeline_model_parallel_size=1",
       "training.model.virtual_pipeline_model_parallel_size=null"});
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  CHECK(count_matches(run.output, kIterationLine) == 3);
  const std::string script =
      read_file(temporary.path / "llama2_70b" / "llama2_70b_submission.sh");
  CHECK(script.find("--group-query-attention \\\n") != std::string::npos);
  CHECK(script.find("--num-query-groups 2 \\\n") != std::string::npos);
  // As llama2_7b, less the keys and values of two of the four heads: 2 layers × 64 × 64.
  CHECK(run.output.find("model parallel rank (0, 0): 139584") != std::string::npos);
}

TEST_CASE("cluster_type auto picks the local cluster without sbatch and says so in one line") {
  TemporaryDirectory temporary;
  auto argv = tiny_run(temporary.path, {"cluster_type=auto", "--dry-run"});
  // An empty PATH: no sbatch, whatever this machine has installed.
  const auto run = launcher::run_and_capture(
      {"env", "PATH=" + temporary.path.string(), argv[0], "main", "training=gpt3/126m",
       "cluster_type=auto", "base_results_dir=" + temporary.path.string(), "--dry-run"});
  INFO(run.output);
  CHECK(run.exit_code == 0);
  CHECK(run.output.find("cluster_type auto → local (no sbatch on PATH)") != std::string::npos);
  CHECK(fs::is_regular_file(temporary.path / "gpt3_126m" / "gpt3_126m_submission.sh"));
  // A dry run submits nothing: no job log.
  for (const auto& entry : fs::directory_iterator(temporary.path / "gpt3_126m")) {
    CHECK_FALSE(entry.path().filename().string().starts_with("log-"));
  }
}

TEST_CASE("an unknown key is refused before anything runs, naming the key and the fix") {
  TemporaryDirectory temporary;
  const auto run = launcher::run_and_capture(
      tiny_run(temporary.path, {"training.trainer.max_stepz=5"}));
  INFO(run.output);
  CHECK(run.exit_code == 2);
  CHECK(run.output.find("max_stepz") != std::string::npos);
  CHECK(run.output.find("max_steps") != std::string::npos);  // did you mean
  CHECK_FALSE(fs::exists(temporary.path / "gpt3_126m"));
}

TEST_CASE("a results directory that cannot be created names the setting to change") {
  // /sys refuses new directories even to root: an installed launcher's default base_results_dir
  // (under its share/ directory) fails the same way for a user who cannot write there.
  const auto run = launcher::run_and_capture(tiny_run("/sys/launcher_results"));
  INFO(run.output);
  CHECK(run.exit_code == 2);
  CHECK(run.output.find("training.run.results_dir: cannot create the results directory "
                        "/sys/launcher_results/gpt3_126m: ") != std::string::npos);
  CHECK(run.output.find("set base_results_dir=DIR") != std::string::npos);
}

TEST_CASE("an unknown group option is refused with the valid options") {
  TemporaryDirectory temporary;
  const auto run = launcher::run_and_capture(
      {std::string(TEST_BIN_DIR) + "/launcher", "main", "training=gpt3/126n",
       "base_results_dir=" + temporary.path.string()});
  INFO(run.output);
  CHECK(run.exit_code == 2);
  CHECK(run.output.find("gpt3/126n") != std::string::npos);
  CHECK(run.output.find("gpt3/126m") != std::string::npos);
}

TEST_CASE("a hostile run name stays literal text: the script runs and nothing is injected") {
  TemporaryDirectory temporary;
  const std::string name = "x'y; $(touch INJECTED)`touch INJECTED2`z";
  // Hydra's grammar: a value with quotes or spaces is written quoted on the command line.
  const auto run = launcher::run_and_capture(tiny_run(
      temporary.path, {"training.run.name=\"" + name + "\"", "training.trainer.max_steps=1"}));
  INFO(run.output);
  CHECK(run.exit_code == 0);
  CHECK(fs::is_directory(temporary.path / name));
  for (const auto& entry : fs::recursive_directory_iterator(temporary.path)) {
    CHECK_FALSE(entry.path().filename() == "INJECTED");
    CHECK_FALSE(entry.path().filename() == "INJECTED2");
  }
}

TEST_CASE("a failing backend makes the launcher fail with the backend's message in the log") {
  TemporaryDirectory temporary;
  // Something only the backend checks (a rule between two flags; each value passes its own
  // rule, which the launcher checks): the launcher's preflight lets it through.
  const auto run = launcher::run_and_capture(
      tiny_run(temporary.path, {"training.model.optim.sched.min_lr=1"}));
  INFO(run.output);
  CHECK(run.exit_code == 2);
  CHECK(run.output.find("--min-lr 1 must lie in [0, --lr 0.0006]") != std::string::npos);
}

TEST_CASE("preflight refuses a bad layout before anything is written or run") {
  TemporaryDirectory temporary;
  const auto run = launcher::run_and_capture(
      tiny_run(temporary.path, {"training.model.num_attention_heads=3"}));
  INFO(run.output);
  CHECK(run.exit_code == 2);
  CHECK(run.output.find("preflight refused the training stage") != std::string::npos);
  CHECK(run.output.find("num_attention_heads 3 does not divide hidden_size 64") != std::string::npos);
  CHECK(run.output.find("memory per GPU") != std::string::npos);
  CHECK_FALSE(fs::exists(temporary.path / "gpt3_126m"));
}

TEST_CASE("pretrain_gpt refuses bad flags with exit status 2 and one clear line") {
  const auto run = launcher::run_and_capture(
      {std::string(TEST_BIN_DIR) + "/pretrain_gpt", "--num-layers", "2", "--no-such-flag"});
  CHECK(run.exit_code == 2);
  CHECK(run.output.find("--no-such-flag") != std::string::npos);
  CHECK(run.output.find("terminate called") == std::string::npos);
}

TEST_CASE("cluster_type auto stays local when sbatch exists but Slurm is not configured") {
  TemporaryDirectory temporary;
  const fs::path bin = temporary.path / "bin";
  fs::create_directories(bin);
  {
    std::ofstream sbatch(bin / "sbatch");
    sbatch << "#!/bin/sh\nexit 1\n";
  }
  fs::permissions(bin / "sbatch", fs::perms::owner_all);
  const auto run = launcher::run_and_capture(
      {"env", "-u", "SLURM_CONF", "PATH=" + bin.string(), std::string(TEST_BIN_DIR) + "/launcher",
       "main", "training=gpt3/126m", "base_results_dir=" + temporary.path.string(), "--dry-run"});
  INFO(run.output);
  CHECK(run.exit_code == 0);
  if (fs::exists("/etc/slurm/slurm.conf")) {
    CHECK(run.output.find("cluster_type auto → bcm") != std::string::npos);
  } else {
    CHECK(run.output.find("cluster_type auto → local (sbatch on PATH but no Slurm configuration") !=
          std::string::npos);
  }
}

TEST_CASE("stages run in order: an empty stage is skipped, conversion exports the checkpoint "
          "training saved, evaluation scores it on LAMBADA") {
  TemporaryDirectory temporary;
  const fs::path test_data = fs::path(TEST_SOURCE_DIR) / "tests/data";
  // LAMBADA's format with passages short enough for the tiny model's 32 positions.
  const fs::path lambada = temporary.path / "lambada_test.jsonl";
  std::ofstream(lambada) << R"({"text": "The cat sat on the mat and looked at the dog"})" << "\n"
                         << R"({"text": "She opened the door and walked into the garden"})" << "\n"
                         << R"({"text": "He poured the coffee into a cup"})" << "\n";
  const auto run = launcher::run_and_capture(tiny_run(
      temporary.path, {"stages=[data_preparation,training,conversion,evaluation]",
                       "training.trainer.max_steps=1",
                       "evaluation.data.lambada=" + lambada.string(),
                       "evaluation.model.vocab_file=" + (test_data / "gpt2-vocab.json").string(),
                       "evaluation.model.merge_file=" + (test_data / "gpt2-merges.txt").string()}));
  INFO(run.output);
  // data_preparation has no input files: nothing to submit, and the chain goes on.
  CHECK(run.output.find("data_preparation.input lists no files, nothing to submit") !=
        std::string::npos);
  CHECK_FALSE(fs::exists(temporary.path / "preprocess_gpt3"));
  // training ran to completion and saved its checkpoint.
  CHECK(run.output.find("training: local job") != std::string::npos);
  CHECK(count_matches(run.output, std::regex(R"( iteration +1/ +1 \|)")) == 1);
  // conversion exported it with checkpoint_util to <conversion results>/hf,
  const fs::path conversion = temporary.path / "gpt3_126m" / "convert_hf";
  CHECK(fs::is_regular_file(conversion / "convert_gpt3_126m_submission.sh"));
  CHECK(run.output.find("as GPT2LMHeadModel to " + (conversion / "hf").string()) != std::string::npos);
  CHECK(fs::is_regular_file(conversion / "hf" / "config.json"));
  CHECK(fs::is_regular_file(conversion / "hf" / "model.safetensors"));
  // and to NeMo's <conversion results>/megatron_gpt.nemo.
  CHECK(run.output.find("as a NeMo archive to " + (conversion / "megatron_gpt.nemo").string()) !=
        std::string::npos);
  CHECK(fs::is_regular_file(conversion / "megatron_gpt.nemo"));
  // evaluation: evaluate_gpt read the model's shape from the checkpoint (the stage passes no
  // model flag) and scored the three passages, as Megatron prints it.
  CHECK(run.output.find("Setting num_layers to 2 from checkpoint") != std::string::npos);
  CHECK(std::regex_search(run.output, std::regex(R"( validation results on LAMBADA \| number correct: \d\.\d{4}E\+00 \| )"
                                                 R"(total examples: 3\.0000E\+00 \| avg accuracy: )")));
  const fs::path results_json = temporary.path / "gpt3_126m" / "eval_lambada" / "lambada_results.json";
  CHECK(fs::is_regular_file(results_json));
  CHECK(read_file(results_json).find("\"total_examples\"") != std::string::npos);
  CHECK(run.exit_code == 0);
}

TEST_CASE("an unknown stage is refused with the valid stages") {
  TemporaryDirectory temporary;
  const auto run = launcher::run_and_capture(tiny_run(temporary.path, {"stages=[trainig]"}));
  CHECK(run.exit_code == 2);
  CHECK(run.output.find("'trainig' is not a stage (valid:") != std::string::npos);
  CHECK(run.output.find("Did you mean 'training'?") != std::string::npos);
  CHECK(run.output.find("valid: data_preparation, training, conversion, evaluation") !=
        std::string::npos);
}

TEST_CASE("unique_output_dir puts every launch in its own results-<timestamp> directory") {
  TemporaryDirectory temporary;
  for (int launch = 0; launch < 2; ++launch) {
    const auto run = launcher::run_and_capture(
        {"env", "UNIQUE_OUTPUT_DIR=1", std::string(TEST_BIN_DIR) + "/launcher", "main",
         "training=gpt3/126m", "cluster_type=local", "base_results_dir=" + temporary.path.string(),
         "--dry-run"});
    INFO(run.output);
    CHECK(run.exit_code == 0);
  }
  std::vector<std::string> launches;
  for (const auto& entry : fs::directory_iterator(temporary.path)) {
    launches.push_back(entry.path().filename().string());
    CHECK(fs::is_regular_file(entry.path() / "gpt3_126m" / "gpt3_126m_submission.sh"));
  }
  REQUIRE(launches.size() == 2);
  for (const auto& name : launches) CHECK(name.starts_with("results-"));
  CHECK(launches[0] != launches[1]);
}

TEST_CASE("unique_output_dir: launchers started at the same moment each get their own directory") {
  // The timestamp is to the second: before, these four wrote into one directory.
  TemporaryDirectory temporary;
  const std::string launcher_command =
      fmt::format("UNIQUE_OUTPUT_DIR=1 {}/launcher main training=gpt3/126m cluster_type=local "
                  "base_results_dir={} --dry-run >/dev/null 2>&1",
                  TEST_BIN_DIR, temporary.path.string());
  const std::string script = fmt::format(
      "status=0; pids=; for i in 1 2 3 4; do {} & pids=\"$pids $!\"; done; "
      "for p in $pids; do wait $p || status=1; done; exit $status", launcher_command);
  const auto run = launcher::run_and_capture({"bash", "-c", script});
  INFO(run.output);
  CHECK(run.exit_code == 0);
  std::set<std::string> launches;
  for (const auto& entry : fs::directory_iterator(temporary.path)) {
    launches.insert(entry.path().filename().string());
    CHECK(fs::is_regular_file(entry.path() / "gpt3_126m" / "gpt3_126m_submission.sh"));
    CHECK(fs::is_regular_file(entry.path() / "gpt3_126m" / "launcher_cmd.log"));
  }
  CHECK(launches.size() == 4);
}

TEST_CASE("a local launch records its job, exit status and log in jobs.jsonl") {
  TemporaryDirectory temporary;
  const auto run = launcher::run_and_capture(
      tiny_run(temporary.path, {"training.trainer.max_steps=1"}));
  REQUIRE(run.exit_code == 0);
  const std::string records = read_file(temporary.path / "gpt3_126m" / "jobs.jsonl");
  CHECK(records.find("\"stage\":\"training\"") != std::string::npos);
  CHECK(records.find("\"cluster\":\"local\"") != std::string::npos);
  CHECK(records.find("\"exit_code\":0") != std::string::npos);
  CHECK(records.find("log-gpt3_126m_") != std::string::npos);
}

TEST_CASE("cluster_type=bcm with cluster.* overrides applies them to the bcm group") {
  // Regression: the overrides used to reach the default (local) group first and be refused
  // with "key 'gres' does not exist in 'cluster'".
  TemporaryDirectory temporary;
  const auto run = launcher::run_and_capture(
      {std::string(TEST_BIN_DIR) + "/launcher", "main", "training=gpt3/126m", "cluster_type=bcm",
       "cluster.gres=null", "cluster.gpus_per_node=null", "cluster.partition=batch",
       "base_results_dir=" + temporary.path.string(), "--dry-run"});
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  const std::string script =
      read_file(temporary.path / "gpt3_126m" / "nemo-megatron-gpt3_126m_submission.sh");
  CHECK(script.find("#SBATCH --partition=batch\n") != std::string::npos);
  CHECK(script.find("gres") == std::string::npos);
}

TEST_CASE("cluster.detach=true returns at once and the job finishes in the background") {
  TemporaryDirectory temporary;
  const auto start = std::chrono::steady_clock::now();
  const auto run = launcher::run_and_capture(
      tiny_run(temporary.path, {"cluster.detach=true", "training.trainer.max_steps=2"}));
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  CHECK(run.output.find("runs in the background") != std::string::npos);
  CHECK(count_matches(run.output, kIterationLine) == 0);  // not streamed: the job is detached
  const fs::path results = temporary.path / "gpt3_126m";
  const auto records = launcher::read_job_records(results);
  REQUIRE(records.size() == 1);
  std::string state = launcher::query_job_state(records[0]);
  while (state == "RUNNING" && std::chrono::steady_clock::now() - start < std::chrono::seconds(60)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    state = launcher::query_job_state(records[0]);
  }
  CHECK(state == "COMPLETED");
  const std::string job_log = read_file(records[0].log_file);
  CHECK(count_matches(job_log, std::regex(R"( iteration +2/ +2 \|)")) == 1);
}

TEST_CASE("status, logs and report follow a benchmark-mode run") {
  TemporaryDirectory temporary;
  const auto run = launcher::run_and_capture(tiny_run(
      temporary.path, {"training.trainer.limit_val_batches=0", "training.model.data.data_impl=mock"}));
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  const std::string launcher_path = std::string(TEST_BIN_DIR) + "/launcher";
  const std::string results = (temporary.path / "gpt3_126m").string();

  const auto status = launcher::run_and_capture({launcher_path, "status", results});
  INFO(status.output);
  CHECK(status.exit_code == 0);
  CHECK(status.output.find("training") != std::string::npos);
  CHECK(status.output.find("COMPLETED") != std::string::npos);

  const auto logs = launcher::run_and_capture({launcher_path, "logs", results});
  CHECK(logs.exit_code == 0);
  CHECK(count_matches(logs.output, kIterationLine) == 3);

  const auto report = launcher::run_and_capture({launcher_path, "report", results});
  INFO(report.output);
  CHECK(report.exit_code == 0);
  CHECK(report.output.find("| gpt3_126m | 2 × 64 | 32 | 2 / 4 | 1 × 1 × 1 | cpu |") != std::string::npos);

  const auto unknown = launcher::run_and_capture({launcher_path, "status", "no_such_run"});
  CHECK(unknown.exit_code == 2);
  CHECK(unknown.output.find("'no_such_run' is neither a results directory") != std::string::npos);
}

TEST_CASE("--cfg shows the config that would be launched, cluster group choice included") {
  // Regression: --cfg composed with the default cluster group, ignoring cluster_type.
  const auto run = launcher::run_and_capture(
      {std::string(TEST_BIN_DIR) + "/launcher", "main", "--cfg", "job", "-p", "cluster",
       "cluster_type=bcm", "cluster.partition=batch"});
  INFO(run.output);
  CHECK(run.exit_code == 0);
  CHECK(run.output.find("partition: batch") != std::string::npos);
  CHECK(run.output.find("gpus_per_node: 8") != std::string::npos);
}

TEST_CASE("several processes on the local cluster start through mpirun and train data-parallel" *
          test_support::release_only()) {
  test_support::use_mpi_test_environment();
  TemporaryDirectory one_device, two_devices;
  const auto single = launcher::run_and_capture(tiny_run(one_device.path));
  REQUIRE(single.exit_code == 0);
  const auto run = launcher::run_and_capture(tiny_run(two_devices.path, {"training.trainer.devices=2"}));
  INFO(run.output);
  const std::string script = read_file(two_devices.path / "gpt3_126m" / "gpt3_126m_submission.sh");
  CHECK(script.find("mpirun -np 2 --oversubscribe") != std::string::npos);
  CHECK(run.exit_code == 0);
  // Two ranks, one data-parallel group: the last rank prints each iteration once, and the
  // losses are one device's (the same global batch, each rank reading its half).
  CHECK(count_matches(run.output, kIterationLine) == 3);
  CHECK(count_matches(run.output, std::regex(R"(\n  data_parallel_size \.+ 2\n)")) == 1);
  const auto expected = test_support::logged_losses(single.output);
  const auto actual = test_support::logged_losses(run.output);
  REQUIRE(expected.size() == 3);
  REQUIRE(actual.size() == 3);
  for (int i = 1; i <= 3; ++i) CHECK(actual.at(i) == doctest::Approx(expected.at(i)).epsilon(1e-6));
}

TEST_CASE("the local cluster is one machine: more than one node is refused") {
  TemporaryDirectory temporary;
  const auto run = launcher::run_and_capture(tiny_run(temporary.path, {"training.trainer.num_nodes=2"}));
  CHECK(run.exit_code == 2);
  CHECK(run.output.find("the local cluster is this one machine, but trainer.num_nodes = 2") !=
        std::string::npos);
}

TEST_CASE("a value of the wrong type is refused before anything runs, naming the key") {
  TemporaryDirectory temporary;
  const auto run = launcher::run_and_capture(tiny_run(temporary.path, {"training.model.num_layers=abc"}));
  INFO(run.output);
  CHECK(run.exit_code == 2);
  CHECK(run.output.find("training.model.num_layers: 'abc' is not an integer; "
                        "training.model.num_layers (--num-layers) takes an integer ≥ 1 (from the "
                        "command line)") != std::string::npos);
  CHECK_FALSE(fs::exists(temporary.path / "gpt3_126m"));
}

TEST_CASE("cmake --install gives a prefix whose launcher trains from its own conf, templates and "
          "tools") {
  // The install rules of CMakeLists.txt, run on this build: prefix/bin holds every executable,
  // prefix/share/megatron_native the conf tree and the job templates. The installed launcher
  // must use those (not the source tree it was built from): the installed copies are marked,
  // a run name in the conf and a line in the template, and the run must show both.
  TemporaryDirectory temporary;
  const fs::path prefix = temporary.path / "prefix";
  const fs::path build = fs::path(TEST_BIN_DIR).parent_path();
  const auto install = launcher::run_and_capture(
      {"cmake", "--install", build.string(), "--prefix", prefix.string()});
  INFO(install.output);
  REQUIRE(install.exit_code == 0);
  for (const char* tool : {"launcher", "pretrain_gpt", "preprocess_data", "checkpoint_util",
                           "evaluate_gpt", "text_generation_server", "text_generation_cli"}) {
    CAPTURE(tool);
    CHECK(fs::is_regular_file(prefix / "bin" / tool));
  }
  const fs::path data = prefix / "share/megatron_native";
  REQUIRE(fs::is_regular_file(data / "conf/config.yaml"));
  REQUIRE(fs::is_regular_file(data / "templates/local.sh.mustache"));

  const fs::path model_yaml = data / "conf/training/gpt3/126m.yaml";
  std::string model = read_file(model_yaml);
  const std::string name_line = "  name: gpt3_126m\n";
  REQUIRE(model.find(name_line) != std::string::npos);
  model.replace(model.find(name_line), name_line.size(), "  name: gpt3_126m_installed\n");
  std::ofstream(model_yaml) << model;
  std::ofstream(data / "templates/local.sh.mustache", std::ios::app) << "# installed template\n";

  std::vector<std::string> argv = tiny_run(temporary.path / "results");
  argv[0] = (prefix / "bin/launcher").string();
  const auto run = launcher::run_and_capture(argv);
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  const fs::path results = temporary.path / "results/gpt3_126m_installed";
  const std::string script = read_file(results / "gpt3_126m_installed_submission.sh");
  CHECK(script.ends_with("# installed template\n"));
  CHECK(script.find(fs::weakly_canonical(prefix / "bin/pretrain_gpt").string()) !=
        std::string::npos);
  CHECK(count_matches(run.output, kIterationLine) == 3);
}
