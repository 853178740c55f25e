// Launches of the same run at the same time, with real `launcher main` processes: each run
// directory must hold one launch's files, each launch must run its own script, and a launch
// that finds the directory taken must be refused naming who holds it (issue 9: 14 of 30 pairs
// used to run each other's script, and a shared "<script>.tmp" made some fail).
// The backend is a stand-in `pretrain_gpt` per launch (backend_bin_dir) that prints which
// launch it belongs to, so a script run by the wrong launcher shows in that launcher's output.
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "launcher/process.hpp"
#include "temporary_directory.hpp"
#include "test_files.hpp"

namespace fs = std::filesystem;

namespace {

using test_support::contains;

using test_support::read_file;
using test_support::TemporaryDirectory;

// <root>/bin-<tag>/pretrain_gpt: prints "stand-in pretrain_gpt of <tag>", sleeps, exits 0.
fs::path stand_in_backend(const fs::path& root, const std::string& tag, double seconds) {
  const fs::path directory = root / ("bin-" + tag);
  fs::create_directories(directory);
  const fs::path program = directory / "pretrain_gpt";
  std::ofstream(program) << "#!/bin/sh\necho \"stand-in pretrain_gpt of " << tag << "\"\nsleep "
                         << seconds << "\n";
  fs::permissions(program, fs::perms::owner_all);
  return directory;
}

std::vector<std::string> launch_argv(const fs::path& results, const std::string& run,
                                     const fs::path& bin_dir, std::vector<std::string> extra) {
  std::vector<std::string> argv = {std::string(TEST_BIN_DIR) + "/launcher", "main",
                                   "cluster_type=local", "base_results_dir=" + results.string(),
                                   "training.run.name=" + run, "backend_bin_dir=" + bin_dir.string()};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

const std::string kInUse = "is in use by";

}  // namespace

TEST_CASE("two launches of one run at once never mix their scripts: one waits its turn or is "
          "refused") {
  TemporaryDirectory temporary;
  constexpr int kPairs = 20;
  for (const bool dry_run : {true, false}) {
    CAPTURE(dry_run);
    const fs::path results = temporary.path / (dry_run ? "dry" : "run");
    std::vector<std::string> tags;
    std::vector<fs::path> bin_dirs;
    // Every stand-in is written before the first launch starts: a launch forked while this
    // thread holds a stand-in open for writing would carry that descriptor into its children,
    // and executing the stand-in would then fail with ETXTBSY (exit 126).
    for (int pair = 0; pair < kPairs; ++pair) {
      for (const char* side : {"A", "B"}) {
        tags.push_back(fmt::format("{}{}", pair, side));
        bin_dirs.push_back(stand_in_backend(temporary.path, tags.back(), 0.05));
      }
    }
    std::vector<std::future<launcher::CapturedRun>> launches;
    for (std::size_t i = 0; i < tags.size(); ++i) {
      std::vector<std::string> extra;
      if (dry_run) extra.push_back("--dry-run");
      launches.push_back(std::async(std::launch::async, launcher::run_and_capture,
                                    launch_argv(results, fmt::format("run{}", i / 2), bin_dirs[i],
                                                extra)));
    }
    int refused = 0;
    for (std::size_t i = 0; i < launches.size(); ++i) {
      const launcher::CapturedRun run = launches[i].get();
      const std::string& tag = tags[i];
      const std::string other = tag.substr(0, tag.size() - 1) + (tag.back() == 'A' ? "B" : "A");
      CAPTURE(tag);
      INFO(run.output);
      if (run.exit_code == 2 && contains(run.output, kInUse)) {
        ++refused;
        continue;
      }
      CHECK(run.exit_code == 0);
      if (!dry_run) {
        CHECK(contains(run.output, "stand-in pretrain_gpt of " + tag + "\n"));
        CHECK_FALSE(contains(run.output, "stand-in pretrain_gpt of " + other + "\n"));
      }
    }
    MESSAGE(refused << " of " << launches.size() << " launches found their run taken");
    // Each run directory holds one launch's files: the config and the script agree.
    for (int pair = 0; pair < kPairs; ++pair) {
      const fs::path directory = results / fmt::format("run{}", pair);
      // The whole config (backend_bin_dir is outside the training section of run{}_hydra.yaml).
      const std::string config = read_file(directory / fmt::format("run{}_launcher_config.yaml", pair));
      const std::string script = read_file(directory / fmt::format("run{}_submission.sh", pair));
      const bool from_a = contains(script, (temporary.path / fmt::format("bin-{}A", pair)).string());
      const bool from_b = contains(script, (temporary.path / fmt::format("bin-{}B", pair)).string());
      CAPTURE(pair);
      CHECK(from_a != from_b);
      CHECK(contains(config, fmt::format("backend_bin_dir: {}", (temporary.path / fmt::format(
                                                                     "bin-{}{}", pair,
                                                                     from_a ? "A" : "B"))
                                                                    .string())));
      for (const auto& entry : fs::directory_iterator(directory)) {
        CHECK_FALSE(entry.path().extension() == ".tmp");  // no temporary file left behind
      }
    }
  }
}

TEST_CASE("a run taken by a running local job is refused, naming the holder, until it ends") {
  TemporaryDirectory temporary;
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  const fs::path results = temporary.path / "results";
  const fs::path slow = stand_in_backend(temporary.path, "slow", 3);
  const fs::path quick = stand_in_backend(temporary.path, "quick", 0);

  // A foreground local job: its launcher holds the run while the job runs.
  auto first = std::async(std::launch::async, launcher::run_and_capture,
                          launch_argv(results, "r", slow, {}));
  const auto started = std::chrono::steady_clock::now();
  auto job_log_exists = [&results] {
    if (!fs::exists(results / "r")) return false;
    for (const auto& entry : fs::directory_iterator(results / "r")) {
      if (entry.path().filename().string().starts_with("log-")) return true;
    }
    return false;
  };
  while (!job_log_exists() && std::chrono::steady_clock::now() - started < std::chrono::seconds(30)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  REQUIRE(job_log_exists());
  const auto second = launcher::run_and_capture(launch_argv(results, "r", quick, {}));
  INFO(second.output);
  CHECK(second.exit_code == 2);
  CHECK(contains(second.output, (results / "r").string() + " " + kInUse + " launcher pid "));
  CHECK(contains(second.output, std::string("on host ") + host));
  CHECK(contains(second.output, "unique_output_dir=true"));
  const auto first_run = first.get();
  INFO(first_run.output);
  CHECK(first_run.exit_code == 0);
  CHECK(contains(read_file(results / "r" / "r_submission.sh"), slow.string()));  // untouched
  // Once the first launch has ended, the run is free again.
  const auto third = launcher::run_and_capture(launch_argv(results, "r", quick, {}));
  INFO(third.output);
  CHECK(third.exit_code == 0);
  CHECK(contains(third.output, "stand-in pretrain_gpt of quick"));

  // A detached job outlives its launcher and keeps the run taken while it runs.
  const auto detached = launcher::run_and_capture(
      launch_argv(results, "d", slow, {"cluster.detach=true"}));
  INFO(detached.output);
  REQUIRE(detached.exit_code == 0);
  const auto during = launcher::run_and_capture(launch_argv(results, "d", quick, {}));
  INFO(during.output);
  CHECK(during.exit_code == 2);
  CHECK(contains(during.output, kInUse + " the detached local job of launcher pid "));
  bool finished = false;
  for (int i = 0; i < 300 && !finished; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    for (const auto& entry : fs::directory_iterator(results / "d")) {
      if (entry.path().filename().string().starts_with(".job-")) finished = true;
    }
  }
  REQUIRE(finished);
  // The job's shell writes its exit status, then exits and lets go of the run.
  launcher::CapturedRun after;
  for (int attempt = 0; attempt < 50; ++attempt) {
    after = launcher::run_and_capture(launch_argv(results, "d", quick, {}));
    if (!(after.exit_code == 2 && contains(after.output, kInUse))) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  INFO(after.output);
  CHECK(after.exit_code == 0);
}

TEST_CASE("stages of one launch that share a results directory, spelled differently, take it once") {
  TemporaryDirectory temporary;
  const fs::path shared = temporary.path / "shared";
  const auto run = launcher::run_and_capture(
      {std::string(TEST_BIN_DIR) + "/launcher", "main", "--dry-run", "cluster_type=local",
       "base_results_dir=" + temporary.path.string(), "stages=[training,conversion]",
       "training.run.results_dir=" + shared.string(),
       "conversion.run.results_dir=" + (temporary.path / "." / "shared" / "").string()});
  INFO(run.output);
  CHECK(run.exit_code == 0);
  CHECK_FALSE(contains(run.output, kInUse));
}
