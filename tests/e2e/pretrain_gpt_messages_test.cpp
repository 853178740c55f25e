// pretrain_gpt's messages about how it was started and where it runs, read from the real
// executable's output as a user sees it: a torchrun-style start is told to use mpirun; a
// machine without a GPU driver is said to have none (not "CUDA driver version is
// insufficient"); the arguments dump is whole although stderr shares its file; and under
// mpirun the setup lines come from rank 0 alone, the iteration lines from the last rank.
#include <doctest/doctest.h>

#include <filesystem>
#include <regex>
#include <string>
#include <vector>

#include "iteration_lines.hpp"
#include "mpi_runs.hpp"
#include "spawned_process.hpp"
#include "temporary_directory.hpp"
#include "test_files.hpp"

namespace fs = std::filesystem;

namespace {

using test_support::read_file;

// A tiny model on mock data, one iteration; `extra` appended.
std::vector<std::string> tiny_flags(std::vector<std::string> extra = {}) {
  std::vector<std::string> flags = {
      "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
      "--seq-length", "16", "--max-position-embeddings", "16", "--micro-batch-size", "1",
      "--global-batch-size", "2", "--train-iters", "2", "--lr", "1e-3", "--tokenizer-type",
      "NullTokenizer", "--vocab-size", "63", "--mock-data", "--eval-iters", "0",
      "--log-interval", "1"};
  flags.insert(flags.end(), extra.begin(), extra.end());
  return flags;
}

// pretrain_gpt alone (no mpirun) with `environment_changes`; its exit status, output in `log`
// (stdout and stderr into one file, as a Slurm job's output).
int run_alone(const std::vector<std::string>& flags, const fs::path& log,
              std::vector<std::string> environment_changes = {}) {
  // None of the launchers' variables from the environment the tests run in.
  for (const char* name : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT",
                           "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE",
                           "SLURM_STEP_ID", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS"}) {
    bool set_by_caller = false;
    for (const auto& change : environment_changes) set_by_caller |= change.starts_with(std::string(name) + "=");
    if (!set_by_caller) environment_changes.emplace_back(name);
  }
  environment_changes.emplace_back("OMP_NUM_THREADS=1");
  std::vector<std::string> argv = {test_support::kPretrainGpt};
  argv.insert(argv.end(), flags.begin(), flags.end());
  return test_support::wait_for_exit(test_support::spawn_process(argv, log, environment_changes));
}

size_t occurrences(const std::string& text, const std::string& part) {
  size_t count = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++count;
  return count;
}

}  // namespace

TEST_CASE(
    "a torchrun-style start on the CPU device with tensor parallelism is told to launch with "
    "mpirun") {
  test_support::TemporaryDirectory directory;
  const fs::path log = directory.path / "torchrun.log";
  const std::vector<std::string> flags =
      tiny_flags({"--tensor-model-parallel-size", "2", "--device", "cpu"});
  // torchrun --nproc-per-node 2 sets these for its first process.
  CHECK(run_alone(flags, log, {"RANK=0", "WORLD_SIZE=2", "LOCAL_RANK=0", "MASTER_ADDR=127.0.0.1",
                               "MASTER_PORT=29500"}) == 2);
  const std::string output = read_file(log);
  INFO(output);
  CHECK(output.find("world size 1 is not divisible") == std::string::npos);
  CHECK(output.find("this process is task 0 of 2 (torchrun launch") != std::string::npos);
  CHECK(output.find("pretrain_gpt's CPU ranks are started by an MPI launcher; launch with "
                    "mpirun/mpiexec (Open MPI: `mpirun -np 2 pretrain_gpt <flags>`)") !=
        std::string::npos);
  CHECK(output.find("GPU ranks (--device cuda) also meet without MPI, over NCCL, through "
                    "torchrun's RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT") !=
        std::string::npos);

  // One process that has torchrun's variables but is alone (WORLD_SIZE=1): the same advice,
  // naming the variables.
  CHECK(run_alone(flags, log, {"RANK=0", "WORLD_SIZE=1", "LOCAL_RANK=0"}) == 2);
  const std::string alone = read_file(log);
  INFO(alone);
  CHECK(alone.find("needs 2 ranks or a multiple, and this is one process: RANK, WORLD_SIZE, "
                   "LOCAL_RANK are set, as torchrun sets them, but no MPI launcher started it") !=
        std::string::npos);
  CHECK(alone.find("`mpirun -np 2 pretrain_gpt <flags>`") != std::string::npos);
}

TEST_CASE("--device cuda where no GPU can be used says so plainly") {
  test_support::TemporaryDirectory directory;
  const fs::path log = directory.path / "cuda.log";
  // No GPU visible whatever the machine has: without a driver the CUDA runtime says "CUDA
  // driver version is insufficient for CUDA runtime version", which reads like an old driver.
  CHECK(run_alone(tiny_flags({"--device", "cuda"}), log, {"CUDA_VISIBLE_DEVICES="}) == 2);
  const std::string output = read_file(log);
  INFO(output);
  CHECK(output.find("--device cuda: no GPU is visible to this process (") != std::string::npos);
  CHECK(output.find("insufficient") == std::string::npos);
  CHECK(output.find("CUDA-capable") == std::string::npos);
  // One of the plain reasons: no driver, no device shown, or a build without CUDA.
  CHECK(std::regex_search(output, std::regex(R"(\((no NVIDIA driver is installed on this machine|the NVIDIA driver shows no device with CUDA_VISIBLE_DEVICES=''|this build has no CUDA support))")));
  // A torchrun-style start with --device cuda is GPU ranks meeting without MPI: validated for
  // its two ranks (no "needs 2 ranks" refusal), it stops where the GPU is missing.
  CHECK(run_alone(tiny_flags({"--device", "cuda", "--tensor-model-parallel-size", "2"}), log,
                  {"CUDA_VISIBLE_DEVICES=", "RANK=1", "WORLD_SIZE=2", "LOCAL_RANK=1",
                   "MASTER_ADDR=127.0.0.1", "MASTER_PORT=29500"}) == 2);
  const std::string torchrun = read_file(log);
  INFO(torchrun);
  CHECK(torchrun.find("--device cuda: no GPU is visible to this process (") != std::string::npos);
  CHECK(torchrun.find("needs 2 ranks") == std::string::npos);
  CHECK(torchrun.find("MPI launcher") == std::string::npos);
}

TEST_CASE("the arguments dump is one block although stderr shares its file") {
  test_support::TemporaryDirectory directory;
  const fs::path log = directory.path / "dump.log";
  // stdout and stderr into one file: the dump (some 7 KB, more than stdio's buffer) was
  // written in pieces, and the log lines that came between (the device line) landed inside.
  REQUIRE(run_alone(tiny_flags(), log) == 0);
  const std::string output = read_file(log);
  INFO(output);
  const size_t begin = output.find("------------------------ arguments ------------------------");
  const size_t end = output.find("-------------------- end of arguments ---------------------");
  REQUIRE(begin != std::string::npos);
  REQUIRE(end != std::string::npos);
  REQUIRE(begin < end);
  CHECK(output.substr(begin, end - begin).find("[pretrain_gpt]") == std::string::npos);
  CHECK(output.find("] [pretrain_gpt] [info] device: ") > end);
}

TEST_CASE("under mpirun the setup lines come from rank 0 and the iteration lines from the last") {
  if (test_support::mpirun_path().empty()) {
    MESSAGE("skipped: no mpirun (Debian: openmpi-bin)");
    return;
  }
  test_support::TemporaryDirectory directory;
  const fs::path log = directory.path / "ranks.log";
  // --use-mcore-models: a flag whose "has no effect here" line every rank would log.
  REQUIRE(test_support::run_pretrain(2, tiny_flags({"--use-mcore-models"}), log) == 0);
  const std::string output = read_file(log);
  INFO(output);
  CHECK(occurrences(output, "[info] device: ") == 1);
  CHECK(occurrences(output, "--use-mcore-models has no effect here") == 1);
  CHECK(occurrences(output, "------------------------ arguments ------------------------") == 1);
  // The last rank's two iteration lines, once each.
  CHECK(test_support::count_matches(output, std::regex(R"(\] iteration +\d+/ +2 \| consumed samples:)")) == 2);
}
