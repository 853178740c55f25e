// One --save directory, one live writer, with the real executables: a second pretrain_gpt
// saving into the directory of a running one is refused with the holder's pid and host (they
// used to interleave their iterations silently), and so is checkpoint_util --import-hf; a
// SIGKILLed run's lock does not block the next run; and an import into a directory whose
// tracker names a training iteration is refused unless --replace-training-tracker is given
// (it used to rewrite the tracker to "release" silently).
#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "launcher/process.hpp"
#include "spawned_process.hpp"
#include "temporary_directory.hpp"
#include "test_files.hpp"

namespace fs = std::filesystem;

namespace {

using test_support::kPretrainGpt;
using test_support::kCheckpointUtil;

using test_support::read_file;
using test_support::spawn_process;

std::vector<std::string> training(const fs::path& save, const char* iterations) {
  return {kPretrainGpt, "--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "2",
          "--seq-length", "16", "--micro-batch-size", "2", "--global-batch-size", "2",
          "--train-iters", iterations, "--lr", "1e-3", "--mock-data", "--vocab-size", "99",
          "--eval-iters", "0", "--log-interval", "1", "--save", save.string(),
          "--save-interval", "1000000"};
}

std::string host_name() {
  std::array<char, 256> name{};
  REQUIRE(gethostname(name.data(), name.size() - 1) == 0);
  return name.data();
}

}  // namespace

TEST_CASE("a --save directory in use by a live run is refused — a killed run's lock is not") {
  test_support::TemporaryDirectory work;
  const fs::path save = work.path / "checkpoints";
  // A first run that trains long enough to be caught alive.
  const pid_t first = spawn_process(training(save, "1000000"), work.path / "first.log");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (read_file(work.path / "first.log").find(" iteration        2/") == std::string::npos) {
    REQUIRE(std::chrono::steady_clock::now() < deadline);
    REQUIRE(waitpid(first, nullptr, WNOHANG) == 0);  // still running
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const std::string holder = "pid " + std::to_string(first) + " on " + host_name();

  const auto second = launcher::run_and_capture(training(save, "2"));
  INFO(second.output);
  CHECK(second.exit_code == 2);
  CHECK(second.output.find("--save " + save.string() + " is in use by another run (" + holder) !=
        std::string::npos);
  CHECK(!fs::exists(save / "latest_checkpointed_iteration.txt"));  // the second saved nothing

  // checkpoint_util --import-hf into it is refused the same way. (The HF directory does not
  // exist: the lock is checked before the model is read.)
  const auto import = launcher::run_and_capture(
      {kCheckpointUtil, "--import-hf", (work.path / "hf").string(), "--save", save.string()});
  INFO(import.output);
  CHECK(import.exit_code == 2);
  CHECK(import.output.find(holder) != std::string::npos);

  // Killed, the first run holds nothing: the next run saves there.
  ::kill(first, SIGKILL);
  REQUIRE(waitpid(first, nullptr, 0) == first);
  const auto third = launcher::run_and_capture(training(save, "2"));
  INFO(third.output);
  CHECK(third.exit_code == 0);
  CHECK(read_file(save / "latest_checkpointed_iteration.txt") == "2");
  CHECK(!fs::exists(save / "save.lock"));  // released when the run ended
}

TEST_CASE("checkpoint_util --import-hf into a training run's directory needs --replace-training-tracker") {
  test_support::TemporaryDirectory work;
  const fs::path save = work.path / "checkpoints";
  const auto trained = launcher::run_and_capture(training(save, "2"));
  INFO(trained.output);
  REQUIRE(trained.exit_code == 0);
  const fs::path hf = work.path / "hf";
  const auto exported = launcher::run_and_capture(
      {kCheckpointUtil, "--load", save.string(), "--export-hf", hf.string()});
  INFO(exported.output);
  REQUIRE(exported.exit_code == 0);

  const auto refused = launcher::run_and_capture(
      {kCheckpointUtil, "--import-hf", hf.string(), "--save", save.string()});
  INFO(refused.output);
  CHECK(refused.exit_code == 2);
  CHECK(refused.output.find("names training iteration 2") != std::string::npos);
  CHECK(refused.output.find("--replace-training-tracker") != std::string::npos);
  CHECK(read_file(save / "latest_checkpointed_iteration.txt") == "2");
  CHECK(!fs::exists(save / "release"));

  // Into a fresh directory, or into one holding a release already, no flag is needed.
  const fs::path fresh = work.path / "fresh";
  for (int time = 0; time < 2; ++time) {
    const auto imported = launcher::run_and_capture(
        {kCheckpointUtil, "--import-hf", hf.string(), "--save", fresh.string()});
    INFO(imported.output);
    CHECK(imported.exit_code == 0);
    CHECK(read_file(fresh / "latest_checkpointed_iteration.txt") == "release");
  }

  const auto forced = launcher::run_and_capture(
      {kCheckpointUtil, "--import-hf", hf.string(), "--save", save.string(), "--replace-training-tracker"});
  INFO(forced.output);
  CHECK(forced.exit_code == 0);
  CHECK(read_file(save / "latest_checkpointed_iteration.txt") == "release");
  CHECK(fs::is_directory(save / "iter_0000002"));  // the training checkpoints stay
}
