// End to end on a real Slurm cluster (tests/e2e/slurm_test_cluster.hpp: slurmctld + two slurmd
// on this machine): `launcher main ... cluster_type=bcm` renders the sbatch script, submits it
// with the real sbatch, and Slurm runs the real pretrain_gpt under srun. This is what proves
// the #SBATCH header and the srun line are accepted by Slurm, which string checks cannot.
// Each TEST_CASE starts its own cluster (one process per case under ctest), so cases can run
// concurrently; every wait is bounded.
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "iteration_lines.hpp"
#include "logged_losses.hpp"
#include "mpi_test_environment.hpp"
#include "sanitized_build.hpp"
#include "slurm_test_cluster.hpp"
#include "temporary_directory.hpp"

namespace fs = std::filesystem;
using namespace std::chrono_literals;

namespace {

using test_support::count_matches;
using test_support::kIterationLine;

using test_support::TemporaryDirectory;

// The launcher with the cluster's environment (SLURM_CONF, PATH with sbatch), a GPU-free bcm
// cluster on the test cluster's `debug` partition, and the tiny model of launcher_main_test.cpp.
std::vector<std::string> tiny_bcm_run(const slurm_test::SlurmTestCluster& cluster,
                                      const fs::path& results, std::vector<std::string> extra = {}) {
  std::vector<std::string> argv = {"env"};
  const std::vector<std::string> environment = cluster.environment();
  argv.insert(argv.end(), environment.begin(), environment.end());
  // sbatch passes the environment on to the job: ranks that join MPI (srun --mpi=pmix) need
  // what tests/mpi_test_environment.hpp sets.
  const std::vector<std::string> mpi = test_support::mpi_test_environment();
  argv.insert(argv.end(), mpi.begin(), mpi.end());
  const std::vector<std::string> launcher_arguments = {
      std::string(TEST_BIN_DIR) + "/launcher", "main", "training=gpt3/126m",
      // cluster_type=bcm alone selects conf/cluster/bcm.yaml, whose keys the cluster.*
      // overrides then set.
      "cluster_type=bcm", "cluster.gres=null", "cluster.gpus_per_node=null",
      "cluster.partition=debug", "cluster.exclusive=false", "cluster.mem=null",
      "base_results_dir=" + results.string(), "training.trainer.max_steps=3",
      "training.model.global_batch_size=4", "training.model.micro_batch_size=2",
      "training.model.encoder_seq_length=32", "training.model.num_layers=2",
      "training.model.hidden_size=64", "training.model.num_attention_heads=4",
      "training.trainer.limit_val_batches=1"};
  argv.insert(argv.end(), launcher_arguments.begin(), launcher_arguments.end());
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

// The job id from the launcher's "Submitted batch job N" line in launcher.log.
std::string submitted_job_id(const fs::path& launcher_log) {
  const std::vector<std::string> ids = slurm_test::submitted_job_ids(launcher_log);
  return ids.empty() ? std::string() : ids.front();
}


const std::string kJobName = "nemo-megatron-gpt3_126m";  // conf/cluster/bcm.yaml's prefix + run name

// Waits (at most two minutes) until training runs: an iteration line in the job's log.
void wait_for_training(const fs::path& job_log) {
  const auto started = std::chrono::steady_clock::now();
  while (slurm_test::read_text(job_log).find(" iteration ") == std::string::npos) {
    REQUIRE(std::chrono::steady_clock::now() - started < 120s);
    std::this_thread::sleep_for(100ms);
  }
}

}  // namespace

TEST_CASE("launcher main submits a tiny gpt3/126m to a real Slurm cluster and it completes") {
  if (!slurm_test::slurm_cluster_available()) return;  // skipped outside CI, with a message
  slurm_test::SlurmTestCluster cluster;
  TemporaryDirectory temporary;
  const auto launched = slurm_test::run_command(tiny_bcm_run(cluster, temporary.path), {}, 120s);
  INFO("launcher output:\n" << launched.output);
  REQUIRE(launched.exit_code == 0);

  const fs::path results = temporary.path / "gpt3_126m";
  const std::string job_id = submitted_job_id(results / "launcher.log");
  REQUIRE_MESSAGE(!job_id.empty(), "no \"Submitted batch job N\" in " << (results / "launcher.log"));

  const slurm_test::JobOutcome outcome = cluster.wait_for_job(job_id, 120s);
  INFO("scontrol show job: " << outcome.record);
  INFO("cluster logs:\n" << cluster.diagnostics());
  REQUIRE(outcome.finished);
  CHECK(outcome.state == "COMPLETED");
  CHECK(outcome.exit_code == "0:0");

  const fs::path job_log = results / ("log-" + kJobName + "_" + job_id + ".out");
  REQUIRE_MESSAGE(fs::is_regular_file(job_log), job_log << " is missing");
  const std::string job_output = slurm_test::read_text(job_log);
  INFO("job log:\n" << job_output);
  CHECK(count_matches(job_output, kIterationLine) == 3);
  CHECK(job_output.find(" validation loss at iteration 3 on validation set | lm loss value: ") !=
        std::string::npos);
  // stderr_to_stdout: true in bcm.yaml, so there is no separate .err file.
  CHECK_FALSE(fs::exists(results / ("log-" + kJobName + "_" + job_id + ".err")));

  // The script Slurm accepted: a 1-node, 1-task job with no GPU request.
  const fs::path script_path = results / (kJobName + "_submission.sh");
  REQUIRE_MESSAGE(fs::is_regular_file(script_path), script_path << " is missing");
  const std::string script = slurm_test::read_text(script_path);
  INFO("script:\n" << script);
  CHECK(script.find("#SBATCH --job-name=" + kJobName + "\n") != std::string::npos);
  CHECK(script.find("#SBATCH --partition=debug\n") != std::string::npos);
  CHECK(script.find("#SBATCH --nodes=1\n") != std::string::npos);
  CHECK(script.find("#SBATCH --ntasks-per-node=1\n") != std::string::npos);
  std::string sbatch_header;  // the #SBATCH lines only
  for (size_t at = script.find("#SBATCH "); at != std::string::npos; at = script.find("#SBATCH ", at + 1)) {
    sbatch_header += script.substr(at, script.find('\n', at) - at + 1);
  }
  for (const char* unwanted : {"--gres", "--gpus", "gpu:", "--exclusive", "--mem"}) {
    CAPTURE(unwanted);
    CHECK(sbatch_header.find(unwanted) == std::string::npos);
  }
  // Slurm saw the same job: its name and the partition, on one of the two nodes.
  CHECK(outcome.record.find("JobName=" + kJobName + " ") != std::string::npos);
  CHECK(outcome.record.find("Partition=debug ") != std::string::npos);
  CHECK(std::regex_search(outcome.record, std::regex(" NodeList=node[12] ")));
}

TEST_CASE("a backend that fails under Slurm leaves a FAILED job whose log has the backend's error") {
  if (!slurm_test::slurm_cluster_available()) return;  // skipped outside CI, with a message
  slurm_test::SlurmTestCluster cluster;
  TemporaryDirectory temporary;
  // Something only the backend checks (the launcher's preflight lets it through, as in
  // launcher_main_test.cpp), so the job is queued and fails inside Slurm.
  const auto launched = slurm_test::run_command(
      tiny_bcm_run(cluster, temporary.path, {"training.model.optim.sched.min_lr=1"}), {}, 120s);
  INFO("launcher output:\n" << launched.output);
  // Submitting succeeded; the failure is the job's, seen by Slurm.
  REQUIRE(launched.exit_code == 0);
  const fs::path results = temporary.path / "gpt3_126m";
  const std::string job_id = submitted_job_id(results / "launcher.log");
  REQUIRE_MESSAGE(!job_id.empty(), "no \"Submitted batch job N\" in " << (results / "launcher.log"));

  const slurm_test::JobOutcome outcome = cluster.wait_for_job(job_id, 120s);
  INFO("scontrol show job: " << outcome.record);
  INFO("cluster logs:\n" << cluster.diagnostics());
  REQUIRE(outcome.finished);
  CHECK(outcome.state == "FAILED");
  // pretrain_gpt exits 2 on a bad configuration; srun and the script's `set -e` pass it on.
  CHECK(outcome.exit_code == "2:0");

  const fs::path job_log = results / ("log-" + kJobName + "_" + job_id + ".out");
  const std::string job_output = slurm_test::read_text(job_log);
  INFO("job log " << job_log << ":\n" << job_output);
  CHECK(job_output.find("--min-lr 1 must lie in [0, --lr 0.0006]") != std::string::npos);
  CHECK(count_matches(job_output, kIterationLine) == 0);
}

TEST_CASE("sbatch refusing the script makes the launcher exit 2 with sbatch's message") {
  if (!slurm_test::slurm_cluster_available()) return;  // skipped outside CI, with a message
  slurm_test::SlurmTestCluster cluster;
  TemporaryDirectory temporary;
  const auto launched = slurm_test::run_command(
      tiny_bcm_run(cluster, temporary.path, {"cluster.partition=nosuchpartition"}), {}, 120s);
  INFO("launcher output:\n" << launched.output);
  CHECK(launched.exit_code == 2);
  CHECK(launched.output.find("sbatch") != std::string::npos);
  CHECK(launched.output.find("invalid partition specified: nosuchpartition") != std::string::npos);
  CHECK(slurm_test::read_text(temporary.path / "gpt3_126m" / "launcher.log").find("Submitted batch job") ==
        std::string::npos);
  // Nothing reached the queue.
  const auto queue = cluster.client("squeue", {"-h", "-o", "%i %j"});
  INFO("squeue: " << queue.output);
  CHECK(queue.exit_code == 0);
  CHECK(queue.output.find_first_not_of(" \n") == std::string::npos);
}

TEST_CASE("a two-stage launch: Slurm runs the second job only after the first (afterany)" *
          test_support::release_only()) {
  slurm_test::SlurmTestCluster cluster;
  TemporaryDirectory temporary;
  const auto launched = slurm_test::run_command(
      tiny_bcm_run(cluster, temporary.path, {"stages=[training,conversion]"}), {}, 120s);
  INFO("launcher output:\n" << launched.output);
  REQUIRE(launched.exit_code == 0);

  const fs::path training_dir = temporary.path / "gpt3_126m";
  const fs::path conversion_dir = training_dir / "convert_hf";
  const std::string training_id = submitted_job_id(training_dir / "launcher.log");
  const std::string conversion_id = submitted_job_id(conversion_dir / "launcher.log");
  REQUIRE(!training_id.empty());
  REQUIRE(!conversion_id.empty());
  CHECK(training_id != conversion_id);
  const std::string conversion_script =
      slurm_test::read_text(conversion_dir / "nemo-megatron-convert_gpt3_126m_submission.sh");
  CHECK(conversion_script.find("#SBATCH --dependency=afterany:" + training_id + ",singleton\n") !=
        std::string::npos);

  const slurm_test::JobOutcome training = cluster.wait_for_job(training_id, 120s);
  const slurm_test::JobOutcome conversion = cluster.wait_for_job(conversion_id, 120s);
  INFO("training: " << training.record << "\nconversion: " << conversion.record);
  REQUIRE(training.finished);
  REQUIRE(conversion.finished);
  CHECK(training.state == "COMPLETED");
  // The conversion exported the checkpoint the training saved.
  CHECK(conversion.state == "COMPLETED");
  CHECK(conversion.exit_code == "0:0");
  // Slurm honoured the dependency: the conversion started no earlier than training ended.
  auto field = [](const std::string& record, const std::string& name) {
    const size_t at = record.find(name + "=");
    return at == std::string::npos ? std::string()
                                   : record.substr(at + name.size() + 1,
                                                   record.find(' ', at) - at - name.size() - 1);
  };
  const std::string training_end = field(training.record, "EndTime");
  const std::string conversion_start = field(conversion.record, "StartTime");
  REQUIRE(!training_end.empty());
  CHECK(conversion_start >= training_end);  // ISO 8601 times compare as text
  const std::string conversion_log = slurm_test::read_text(
      conversion_dir / ("log-nemo-megatron-convert_gpt3_126m_" + conversion_id + ".out"));
  CHECK(conversion_log.find(" exported ") != std::string::npos);
  CHECK(conversion_log.find("as GPT2LMHeadModel") != std::string::npos);
  CHECK(fs::is_regular_file(conversion_dir / "hf" / "model.safetensors"));
}

TEST_CASE("two Slurm nodes train data-parallel through the sbatch script (srun --mpi=pmix)" *
          test_support::release_only()) {
  // cluster.srun_args carries srun's PMIx switch, as a NeMo bcm.yaml's srun_args does: the
  // tasks then join MPI and train one data-parallel group across node1 and node2, with the
  // losses of the same run on one node.
  slurm_test::SlurmTestCluster cluster;
  TemporaryDirectory one_node, two_nodes;
  const auto single = slurm_test::run_command(tiny_bcm_run(cluster, one_node.path), {}, 120s);
  REQUIRE(single.exit_code == 0);
  const auto launched = slurm_test::run_command(
      tiny_bcm_run(cluster, two_nodes.path,
                   {"training.trainer.num_nodes=2", "cluster.srun_args=['--mpi=pmix']"}),
      {}, 120s);
  INFO("launcher output:\n" << launched.output);
  REQUIRE(launched.exit_code == 0);
  std::vector<std::string> logs;
  for (const fs::path& results : {one_node.path / "gpt3_126m", two_nodes.path / "gpt3_126m"}) {
    const std::string job_id = submitted_job_id(results / "launcher.log");
    REQUIRE(!job_id.empty());
    const slurm_test::JobOutcome outcome = cluster.wait_for_job(job_id, 120s);
    logs.push_back(slurm_test::read_text(results / ("log-" + kJobName + "_" + job_id + ".out")));
    INFO("scontrol show job: " << outcome.record);
    INFO("job log:\n" << logs.back());
    INFO("cluster logs:\n" << cluster.diagnostics());
    REQUIRE(outcome.finished);
    CHECK(outcome.state == "COMPLETED");
  }
  const std::string script =
      slurm_test::read_text(two_nodes.path / "gpt3_126m" / (kJobName + "_submission.sh"));
  CHECK(script.find("--mpi=pmix") != std::string::npos);
  const auto one_node_losses = test_support::logged_losses(logs[0]);
  int lines = 0;
  const auto two_nodes_losses = test_support::logged_losses(logs[1], &lines);
  REQUIRE(one_node_losses.size() == 3);
  CHECK(lines == 3);  // printed once, by the last rank
  REQUIRE(two_nodes_losses.size() == 3);
  CHECK(std::regex_search(logs[1], std::regex(R"(\n  data_parallel_size \.+ 2\n)")));
  for (int i = 1; i <= 3; ++i) {
    CHECK(two_nodes_losses.at(i) == doctest::Approx(one_node_losses.at(i)).epsilon(1e-6));
  }
}

TEST_CASE("kill -9 of one rank of a two-node Slurm job ends the job FAILED within seconds" *
          test_support::release_only()) {
  // srun --kill-on-bad-exit=1 (or KillOnBadExit=1 in slurm.conf) ends the step when a task
  // dies; without it the other rank would wait in its collective until
  // --distributed-timeout-minutes ended it (docs/parallelism.md).
  slurm_test::SlurmTestCluster cluster;
  TemporaryDirectory temporary;
  const auto launched = slurm_test::run_command(
      tiny_bcm_run(cluster, temporary.path,
                   {"training.trainer.num_nodes=2",
                    "cluster.srun_args=['--mpi=pmix','--kill-on-bad-exit=1']",
                    "training.trainer.max_steps=100000"}),
      {}, 120s);
  INFO("launcher output:\n" << launched.output);
  REQUIRE(launched.exit_code == 0);
  const fs::path results = temporary.path / "gpt3_126m";
  const std::string job_id = submitted_job_id(results / "launcher.log");
  REQUIRE(!job_id.empty());
  const fs::path job_log = results / ("log-" + kJobName + "_" + job_id + ".out");
  wait_for_training(job_log);
  // The job's ranks: the pretrain_gpt processes whose command line names this run's directory.
  std::vector<pid_t> ranks;
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string command_line = slurm_test::read_text(entry.path() / "cmdline");
    const std::string program = command_line.substr(0, command_line.find('\0'));
    if (fs::path(program).filename() == "pretrain_gpt" &&  // not srun, which names it too
        command_line.find(temporary.path.string()) != std::string::npos) {
      ranks.push_back(static_cast<pid_t>(std::stol(name)));
    }
  }
  REQUIRE(ranks.size() == 2);
  const auto killed_at = std::chrono::steady_clock::now();
  REQUIRE(kill(ranks.back(), SIGKILL) == 0);
  const slurm_test::JobOutcome outcome = cluster.wait_for_job(job_id, 120s);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count();
  INFO("scontrol show job: " << outcome.record);
  REQUIRE(outcome.finished);
  CHECK(outcome.state == "FAILED");
  CHECK(seconds < 60);
}

TEST_CASE(
    "scancel --signal=TERM of a two-node job: both ranks save one iteration and the job completes" *
    test_support::release_only()) {
  // What a preemption or a time limit sends first. NeMo's preemption callback (on by default)
  // is --exit-signal-handler here: every task finishes the iteration, the checkpoint of that
  // iteration is saved, and each exits 0, so the job ends COMPLETED with a checkpoint to resume.
  slurm_test::SlurmTestCluster cluster;
  TemporaryDirectory temporary;
  const auto launched = slurm_test::run_command(
      tiny_bcm_run(cluster, temporary.path,
                   {"training.trainer.num_nodes=2", "cluster.srun_args=['--mpi=pmix']",
                    "training.trainer.max_steps=100000"}),
      {}, 120s);
  INFO("launcher output:\n" << launched.output);
  REQUIRE(launched.exit_code == 0);
  const fs::path results = temporary.path / "gpt3_126m";
  const std::string script = slurm_test::read_text(results / (kJobName + "_submission.sh"));
  CHECK(script.find("--exit-signal-handler") != std::string::npos);
  const std::string job_id = submitted_job_id(results / "launcher.log");
  REQUIRE(!job_id.empty());
  const fs::path job_log = results / ("log-" + kJobName + "_" + job_id + ".out");
  wait_for_training(job_log);
  const auto signalled = cluster.client("scancel", {"--signal=TERM", job_id});
  INFO("scancel: " << signalled.output);
  REQUIRE(signalled.exit_code == 0);
  const slurm_test::JobOutcome outcome = cluster.wait_for_job(job_id, 120s);
  const std::string log = slurm_test::read_text(job_log);
  INFO("scontrol show job: " << outcome.record);
  INFO("job log:\n" << log);
  REQUIRE(outcome.finished);
  CHECK(outcome.state == "COMPLETED");
  CHECK(log.find("[exiting program after receiving SIGTERM.] datetime: ") != std::string::npos);
  // The checkpoint of the last iteration trained, where a relaunch resumes
  // (exp_manager.resume_if_exists).
  std::smatch tracked;
  const std::string tracker =
      slurm_test::read_text(results / "results" / "checkpoints" / "latest_checkpointed_iteration.txt");
  REQUIRE(std::regex_match(tracker, tracked, std::regex(R"((\d+)\s*)")));
  const int iteration = std::stoi(tracked[1]);
  CHECK(iteration < 100000);
  CHECK(std::regex_search(log, std::regex(" iteration +" + std::to_string(iteration) + "/")));
  CHECK(fs::is_directory(results / "results" / "checkpoints" / fmt::format("iter_{:07d}", iteration)));
}

TEST_CASE(
    "num_nodes=2 without srun_args: the script starts srun under PMIx itself and both nodes "
    "train" *
    test_support::release_only()) {
  // No --mpi in cluster.srun_args: the script asks `srun --mpi=list`, finds this Slurm's PMIx
  // and starts the tasks under it, so they join MPI (before, each refused to train alone).
  slurm_test::SlurmTestCluster cluster;
  TemporaryDirectory temporary;
  const auto launched = slurm_test::run_command(
      tiny_bcm_run(cluster, temporary.path, {"training.trainer.num_nodes=2"}), {}, 120s);
  INFO("launcher output:\n" << launched.output);
  REQUIRE(launched.exit_code == 0);
  const fs::path results = temporary.path / "gpt3_126m";
  const std::string script = slurm_test::read_text(results / (kJobName + "_submission.sh"));
  CHECK(script.find("#SBATCH --nodes=2\n") != std::string::npos);
  CHECK(script.find("#SBATCH --ntasks-per-node=1\n") != std::string::npos);
  CHECK(script.find(
            "if srun --mpi=list 2>&1 | grep -w pmix >/dev/null; then srun_mpi=--mpi=pmix; fi\n") !=
        std::string::npos);
  const std::string job_id = submitted_job_id(results / "launcher.log");
  REQUIRE(!job_id.empty());
  const slurm_test::JobOutcome outcome = cluster.wait_for_job(job_id, 120s);
  INFO("scontrol show job: " << outcome.record);
  const std::string job_log = slurm_test::read_text(results / ("log-" + kJobName + "_" + job_id + ".out"));
  INFO("job log:\n" << job_log);
  INFO("cluster logs:\n" << cluster.diagnostics());
  REQUIRE(outcome.finished);
  CHECK(outcome.record.find("NodeList=node[1-2]") != std::string::npos);
  CHECK(outcome.state == "COMPLETED");
  CHECK(std::regex_search(job_log, std::regex(R"(\n  data_parallel_size \.+ 2\n)")));
  CHECK(test_support::logged_losses(job_log).size() == 3);
  CHECK(job_log.find("not started through MPI") == std::string::npos);
}
