// Crash safety of checkpoints, with real processes: pretrain_gpt saves every iteration and is
// killed with SIGKILL at chosen and at random moments, several times while a save is under
// way. Each time, the checkpoint the tracker names must load (every tensor passing its
// checksum), and a run resumed from it (--load) must reach the same losses and the same final
// weights, bit for bit, as a run that was never killed. The resumed run also removes what the
// killed save left behind.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "backend/ckpt/checkpoint.hpp"
#include "backend/ckpt/checkpoint_file.hpp"
#include "spawned_process.hpp"
#include "temporary_directory.hpp"
#include "test_files.hpp"

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

using test_support::read_file;

// One OpenMP thread: the results do not depend on the thread count, and on a busy two-core
// machine spinning OpenMP workers make a 30-iteration run take seconds instead of a fraction
// of one.
pid_t spawn(const std::vector<std::string>& argv, const fs::path& log) {
  return test_support::spawn_process(argv, log, {"OMP_NUM_THREADS=1"});
}

int run_to_completion(const std::vector<std::string>& argv, const fs::path& log) {
  return test_support::wait_for_exit(spawn(argv, log));
}

constexpr int kTrainIters = 30;

std::vector<std::string> training_command(const fs::path& save_directory, bool load) {
  std::vector<std::string> argv = {
      std::string(TEST_BIN_DIR) + "/pretrain_gpt", "--num-layers", "2", "--hidden-size", "64",
      "--num-attention-heads", "4", "--seq-length", "32", "--micro-batch-size", "2",
      "--global-batch-size", "4", "--train-iters", std::to_string(kTrainIters), "--lr", "1e-3",
      "--lr-warmup-iters", "3", "--lr-decay-style", "cosine", "--vocab-size", "255",
      "--mock-data", "--log-interval", "1", "--eval-iters", "0", "--hidden-dropout", "0.1",
      "--attention-dropout", "0.1", "--save", save_directory.string(), "--save-interval", "1"};
  if (load) argv.insert(argv.end(), {"--load", save_directory.string()});
  return argv;
}

// iteration → the "lm loss: ..." text of its log line.
std::map<int, std::string> logged_loss_texts(const std::string& log) {
  static const std::regex line(R"( iteration +(\d+)/ +\d+ \|.*\| lm loss: ([0-9.E+-]+) \|)");
  std::map<int, std::string> losses;
  for (auto it = std::sregex_iterator(log.begin(), log.end(), line); it != std::sregex_iterator(); ++it) {
    losses[std::stoi((*it)[1])] = (*it)[2];
  }
  return losses;
}

bool has_leftover(const fs::path& directory) {
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(directory, error)) {
    const std::string name = entry.path().filename().string();
    if (name.find(".tmp.") != std::string::npos || name.find(".tmp-") != std::string::npos) return true;
  }
  return false;
}

// Every tensor of the tracked checkpoint reads back and passes its checksum.
void check_tracked_checkpoint_loads(const fs::path& directory) {
  const auto tracked = backend::read_checkpoint_tracker(directory);
  if (!tracked) return;  // killed before the first save finished: nothing tracked yet
  const backend::CheckpointFileReader reader(tracked->file);
  CHECK(reader.metadata()["iteration"] == tracked->iteration);
  for (const auto& entry : reader.tensors()) CHECK_NOTHROW(reader.read_bytes(entry));
}

void check_same_tensor_bytes(const fs::path& expected_file, const fs::path& actual_file) {
  const backend::CheckpointFileReader expected(expected_file);
  const backend::CheckpointFileReader actual(actual_file);
  REQUIRE(expected.tensors().size() == actual.tensors().size());
  for (const auto& entry : expected.tensors()) {
    const auto* other = actual.find(entry.name);
    REQUIRE_MESSAGE(other != nullptr, entry.name);
    CHECK_MESSAGE(expected.read_bytes(entry) == actual.read_bytes(*other), entry.name);
  }
}

enum class KillMoment { during_a_save, after_a_save, random };

struct Attempt {
  KillMoment moment;
  double delay_seconds = 0;  // for random
};

}  // namespace

TEST_CASE("SIGKILL at any moment leaves a loadable checkpoint and the resumed run matches") {
  test_support::TemporaryDirectory temporary;
  const fs::path reference = temporary.path / "reference";
  const auto start = Clock::now();
  REQUIRE(run_to_completion(training_command(reference, false), temporary.path / "reference.log") == 0);
  const double reference_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  const auto reference_losses = logged_loss_texts(read_file(temporary.path / "reference.log"));
  REQUIRE(reference_losses.size() == kTrainIters);
  const fs::path reference_final = backend::checkpoint_file_path(reference, kTrainIters);

  const unsigned seed = std::random_device{}();
  CAPTURE(seed);  // a failure names the seed that chose the delays
  std::mt19937 random(seed);
  std::uniform_real_distribution<double> delay(0.0, reference_seconds);
  std::vector<Attempt> attempts = {{KillMoment::during_a_save}, {KillMoment::during_a_save},
                                   {KillMoment::during_a_save}, {KillMoment::after_a_save}};
  for (int i = 0; i < 3; ++i) attempts.push_back({KillMoment::random, delay(random)});

  int killed_inside_a_save = 0;
  for (size_t n = 0; n < attempts.size(); ++n) {
    const Attempt& attempt = attempts[n];
    CAPTURE(n);
    CAPTURE(attempt.delay_seconds);
    const fs::path directory = temporary.path / ("run" + std::to_string(n));
    const fs::path killed_log = temporary.path / ("killed" + std::to_string(n) + ".log");
    const pid_t pid = spawn(training_command(directory, false), killed_log);

    // Choose the moment: a temporary iteration directory appearing means a save is under way
    // (the kill lands somewhere in mkdir, write, fsync or the renames); a tracker naming
    // iteration 3 means a save just finished.
    const auto started = Clock::now();
    const auto deadline = started + std::chrono::seconds(20);
    if (attempt.moment == KillMoment::random) {
      std::this_thread::sleep_for(std::chrono::duration<double>(attempt.delay_seconds));
    } else {
      const int skip_saves = static_cast<int>(n) * 5;  // not always the first save
      while (Clock::now() < deadline && waitpid(pid, nullptr, WNOHANG) == 0) {
        if (attempt.moment == KillMoment::during_a_save) {
          const auto tracked = backend::read_checkpoint_tracker(directory);
          if ((tracked ? tracked->iteration : 0) >= skip_saves && has_leftover(directory)) break;
        } else {
          const auto tracked = backend::read_checkpoint_tracker(directory);
          if (tracked && tracked->iteration >= 3) break;
        }
      }
    }
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    if (attempt.moment == KillMoment::during_a_save && has_leftover(directory)) ++killed_inside_a_save;

    check_tracked_checkpoint_loads(directory);
    const auto tracked = backend::read_checkpoint_tracker(directory);
    const int resumed_from = tracked ? static_cast<int>(tracked->iteration) : 0;
    CAPTURE(resumed_from);

    const fs::path resumed_log = temporary.path / ("resumed" + std::to_string(n) + ".log");
    REQUIRE(run_to_completion(training_command(directory, true), resumed_log) == 0);
    const std::string log = read_file(resumed_log);
    INFO(log.substr(0, 4000));
    if (tracked) {
      CHECK(log.find(" loading checkpoint from " + directory.string() + " at iteration " +
                     std::to_string(resumed_from) + "\n") != std::string::npos);
    } else {
      CHECK(log.find("will not load any checkpoints and will start from random") != std::string::npos);
    }
    const auto losses = logged_loss_texts(log);
    CHECK(losses.size() == static_cast<size_t>(kTrainIters - resumed_from));
    for (const auto& [iteration, loss] : losses) {
      const int logged_iteration = iteration;  // clang 14 cannot capture a structured binding
      CAPTURE(logged_iteration);
      CHECK(loss == reference_losses.at(iteration));
    }
    check_same_tensor_bytes(reference_final, backend::checkpoint_file_path(directory, kTrainIters));
    CHECK_FALSE(has_leftover(directory));  // the resumed run's first save cleaned up
  }
  // The moment that matters most was hit: a save cut short, its temporary left behind.
  CHECK(killed_inside_a_save > 0);
}
