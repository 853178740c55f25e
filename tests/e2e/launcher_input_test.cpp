// Hostile input to the real `launcher` binary: paths and names that cannot become the run's
// directories and files, empty root directories, keyless overrides and CLI11's usage errors.
// Each must end in exit status 2 with a message naming the key or flag, and nothing written
// (standards: bad input loses nothing, never exit 3 or a signal).
#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "launcher/process.hpp"
#include "temporary_directory.hpp"
#include "test_files.hpp"

namespace fs = std::filesystem;

namespace {

using test_support::contains;

using test_support::read_file;
using test_support::TemporaryDirectory;

std::string launcher_path() {
  return std::string(TEST_BIN_DIR) + "/launcher";
}

// `launcher main --dry-run` of gpt3/126m into `results`, with the extra arguments.
launcher::CapturedRun dry_run(const fs::path& results, const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {launcher_path(), "main", "--dry-run", "cluster_type=local",
                                   "base_results_dir=" + results.string()};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return launcher::run_and_capture(argv);
}

std::vector<std::string> everything_under(const fs::path& directory) {
  std::vector<std::string> paths;
  for (const auto& entry : fs::recursive_directory_iterator(directory)) {
    paths.push_back(fs::relative(entry.path(), directory).string());
  }
  return paths;
}

}  // namespace

TEST_CASE("hostile config input ends in exit status 2 naming the problem, never a signal") {
  TemporaryDirectory temporary;
  const fs::path conf = temporary.path / "conf";
  fs::copy(fs::path(TEST_SOURCE_DIR) / "conf", conf, fs::copy_options::recursive);
  auto write = [](const fs::path& file, const std::string& text) { std::ofstream(file) << text; };
  write(conf / "cluster" / "self.yaml", "defaults:\n  - /cluster: self\npartition: x\n");
  write(conf / "cluster" / "unclosed.yaml", "partition: \"unclosed\naccount: x\n");
  write(conf / "cluster" / "latin1.yaml", "partition: caf\xe9\n");
  struct Case {
    std::vector<std::string> arguments;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"+x=${multiply:-4611686018427387904,2}", "debug=${divide_floor:${x},-1}"},
       "the quotient does not fit in a 64-bit integer"},
      {{"+x=${multiply:-4611686018427387904,2}", "debug=${divide_ceil:${x},-1}"},
       "the quotient does not fit in a 64-bit integer"},
      {{"debug=${divide_floor:1,0}"}, "division by zero"},
      {{"cluster=self"}, "defaults list cycle: config.yaml → cluster/self.yaml → cluster/self.yaml"},
      {{"cluster=unclosed"}, (conf / "cluster" / "unclosed.yaml").string() +
                                 ":1:12: the quoted string that starts here is not closed"},
      {{"cluster=latin1"},
       (conf / "cluster" / "latin1.yaml").string() + ":1:15: invalid UTF-8 (byte 0xe9)"},
      {{"+x=caf\xe9"}, "invalid UTF-8 at column 7 (byte 0xe9)"},
      // As deep as one argument can be (Linux takes 128 KiB per argument).
      {{"+x=" + std::string(60'000, '[') + std::string(60'000, ']')}, "levels of nested [ ]"},
  };
  for (const Case& item : cases) {
    std::vector<std::string> argv = {launcher_path(), "main", "--dry-run", "--config-dir",
                                     conf.string(), "cluster_type=local",
                                     "base_results_dir=" + (temporary.path / "results").string()};
    argv.insert(argv.end(), item.arguments.begin(), item.arguments.end());
    const auto run = launcher::run_and_capture(argv);
    CAPTURE(item.message);
    INFO(run.output.substr(0, 2000));
    CHECK(run.exit_code == 2);
    CHECK(contains(run.output, item.message));
    CHECK_FALSE(fs::exists(temporary.path / "results"));
  }
}

TEST_CASE("paths and names that cannot be the run's directory are refused before anything is "
          "written") {
  TemporaryDirectory temporary;
  struct Case {
    std::vector<std::string> overrides;
    std::string message;
  };
  const std::string long_name(100'000, 'a');
  const std::vector<Case> cases = {
      {{"training.run.results_dir=''"}, "training.run.results_dir is empty"},
      {{"training.run.name=" + long_name}, "training.run.name 'aaaa"},
      {{"training.run.name=" + std::string(201, 'b')}, "is longer than 200 bytes"},
      {{"training.run.name=a/b"}, "training.run.name 'a/b' contains '/'"},
      {{"training.run.name='..'"}, "training.run.name '..' is not a usable file name"},
      {{"training.run.results_dir=" + (temporary.path / std::string(300, 'c')).string()},
       "is longer than 255 bytes"},
      {{"cluster.job_name_prefix=" + std::string(195, 'p')},
       "the job name (cluster.job_name_prefix + training.run.name)"},
  };
  for (const Case& item : cases) {
    CAPTURE(item.message);
    const auto run = dry_run(temporary.path / "results", item.overrides);
    INFO(run.output.substr(0, 2000));
    CHECK(run.exit_code == 2);
    CHECK(contains(run.output, item.message));
    CHECK(everything_under(temporary.path).empty());
  }

  // A file where a directory would go.
  std::ofstream(temporary.path / "file") << "x";
  const auto under_file =
      dry_run(temporary.path / "file" / "results", {"training.run.name=r"});
  CHECK(under_file.exit_code == 2);
  CHECK(contains(under_file.output, (temporary.path / "file").string() +
                                        " exists and is not a directory"));
  fs::remove(temporary.path / "file");

  // A launcher_scripts_path that does not exist is refused before results/ is created under it
  // (the templates come with the launcher, so that is not what it is checked for).
  const fs::path nonexistent = temporary.path / "nonexistent";
  const auto no_scripts = launcher::run_and_capture(
      {launcher_path(), "main", "--dry-run", "cluster_type=local",
       "launcher_scripts_path=" + nonexistent.string()});
  INFO(no_scripts.output);
  CHECK(no_scripts.exit_code == 2);
  CHECK(contains(no_scripts.output,
                 "launcher_scripts_path=" + nonexistent.string() + ": no such directory"));
  CHECK_FALSE(fs::exists(nonexistent));
  CHECK(everything_under(temporary.path).empty());
}

TEST_CASE("a script that cannot be rendered stops the launch before any directory is made") {
  TemporaryDirectory temporary;
  // A templates/ directory without the bcm template: the training job renders, submission.sh
  // of conversion would not; nothing of either is written.
  fs::create_directories(temporary.path / "scripts" / "templates");
  fs::copy_file(fs::path(TEST_SOURCE_DIR) / "templates" / "local.sh.mustache",
                temporary.path / "scripts" / "templates" / "local.sh.mustache");
  const auto run = dry_run(temporary.path / "results",
                           {"launcher_scripts_path=" + (temporary.path / "scripts").string(),
                            "cluster_type=bcm"});
  INFO(run.output);
  CHECK(run.exit_code == 2);
  CHECK(contains(run.output, "bcm.sbatch.mustache not found"));
  CHECK_FALSE(fs::exists(temporary.path / "results"));
}

TEST_CASE("an empty base_results_dir or data_dir is refused, not turned into /") {
  // With base_results_dir='' the run's directory was /<run name>: this name makes sure the
  // test itself does not leave a directory at the root if the launcher ever did so again.
  const std::string name = "megatron_native_empty_base_" + std::to_string(getpid());
  const auto run = launcher::run_and_capture({launcher_path(), "main", "--dry-run",
                                              "cluster_type=local", "base_results_dir=''",
                                              "training.run.name=" + name});
  std::error_code ignored;
  const bool written_at_root = fs::exists("/" + name);
  fs::remove_all("/" + name, ignored);
  INFO(run.output);
  CHECK(run.exit_code == 2);
  CHECK(contains(run.output, "base_results_dir is empty"));
  CHECK_FALSE(written_at_root);

  TemporaryDirectory temporary;
  const auto data = dry_run(temporary.path, {"data_dir=''"});
  CHECK(data.exit_code == 2);
  CHECK(contains(data.output, "data_dir is empty"));
}

TEST_CASE("overrides without a key are refused, a bare ++ included") {
  TemporaryDirectory temporary;
  for (const char* bare : {"++", "+", "~", "=", "++="}) {
    CAPTURE(bare);
    for (bool last : {true, false}) {
      const auto run = last ? dry_run(temporary.path, {bare})
                            : dry_run(temporary.path, {bare, "training.trainer.max_steps=3"});
      INFO(run.output);
      CHECK(run.exit_code == 2);
      CHECK(contains(run.output, "expected a key (overrides are key=value)"));
    }
  }
  CHECK(everything_under(temporary.path).empty());
  const auto status = launcher::run_and_capture({launcher_path(), "status", "++"});
  CHECK(status.exit_code == 2);
}

TEST_CASE("status, logs, report and --config-dir with a name too long for a path exit with 2") {
  const std::string long_name(100'000, 'a');
  for (const std::vector<std::string>& arguments : std::vector<std::vector<std::string>>{
           {"status", long_name}, {"logs", long_name}, {"report", long_name},
           {"main", "--config-dir", long_name, "--dry-run"}}) {
    std::vector<std::string> argv = {launcher_path()};
    argv.insert(argv.end(), arguments.begin(), arguments.end());
    const auto run = launcher::run_and_capture(argv);
    CAPTURE(arguments[0]);
    INFO(run.output.substr(0, 500));
    CHECK(run.exit_code == 2);
    CHECK_FALSE(contains(run.output, "internal error"));
  }
}

TEST_CASE("usage errors exit with status 2 and CLI11's message — --help and --version with 0") {
  struct Case {
    std::vector<std::string> arguments;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"main", "--no-such-flag"}, "The following argument was not expected: --no-such-flag"},
      {{"--no-such-flag"}, "A subcommand is required"},
      {{}, "A subcommand is required"},
      {{"no-such-command"}, "A subcommand is required"},
      {{"logs"}, "run is required"},
      {{"logs", "a", "b"}, "run: At Most 1 required but received 2"},
      {{"main", "--cfg"}, "--cfg: 1 required TEXT missing"},
      {{"main", "--config-dir"}, "--config-dir: 1 required TEXT missing"},
      {{"report"}, "runs is required"},
      {{"main", "--dry-run=maybe"}, "Could not convert: --dry-run = maybe"},
  };
  for (const Case& item : cases) {
    std::vector<std::string> argv = {launcher_path()};
    argv.insert(argv.end(), item.arguments.begin(), item.arguments.end());
    const auto run = launcher::run_and_capture(argv);
    CAPTURE(item.message);
    INFO(run.output);
    CHECK(run.exit_code == 2);
    CHECK(contains(run.output, item.message));
  }
  for (const std::vector<std::string>& arguments :
       std::vector<std::vector<std::string>>{{"--help"}, {"main", "--help"}, {"--version"}}) {
    std::vector<std::string> argv = {launcher_path()};
    argv.insert(argv.end(), arguments.begin(), arguments.end());
    const auto run = launcher::run_and_capture(argv);
    INFO(run.output);
    CHECK(run.exit_code == 0);
  }
}

TEST_CASE("env_vars that are not strings are exported as their text, without a line break") {
  TemporaryDirectory temporary;
  const auto run = dry_run(temporary.path, {"env_vars.OMP_NUM_THREADS=4", "env_vars.NCCL_DEBUG=true",
                                            "+env_vars.RATIO=0.5", "+env_vars.NAME='a b'"});
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  const std::string script = read_file(temporary.path / "gpt3_126m" / "gpt3_126m_submission.sh");
  INFO(script);
  CHECK(contains(script, "export OMP_NUM_THREADS=4\n"));
  CHECK(contains(script, "export NCCL_DEBUG=true\n"));
  CHECK(contains(script, "export RATIO=0.5\n"));
  CHECK(contains(script, "export NAME='a b'\n"));
}

TEST_CASE("tensor parallelism exports CUDA_DEVICE_MAX_CONNECTIONS=1, and env_vars overrides it") {
  TemporaryDirectory temporary;
  const std::vector<std::string> tp2 = {"training.trainer.devices=2",
                                        "training.model.tensor_model_parallel_size=2"};
  const auto run = dry_run(temporary.path / "default", tp2);
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  const std::string script =
      read_file(temporary.path / "default" / "gpt3_126m" / "gpt3_126m_submission.sh");
  INFO(script);
  CHECK(contains(script, "export CUDA_DEVICE_MAX_CONNECTIONS=1\n"));

  std::vector<std::string> overridden = tp2;
  overridden.push_back("+env_vars.CUDA_DEVICE_MAX_CONNECTIONS=8");
  const auto second = dry_run(temporary.path / "overridden", overridden);
  INFO(second.output);
  REQUIRE(second.exit_code == 0);
  const std::string replaced =
      read_file(temporary.path / "overridden" / "gpt3_126m" / "gpt3_126m_submission.sh");
  INFO(replaced);
  CHECK(contains(replaced, "export CUDA_DEVICE_MAX_CONNECTIONS=8\n"));
  CHECK_FALSE(contains(replaced, "CUDA_DEVICE_MAX_CONNECTIONS=1"));

  const auto plain = dry_run(temporary.path / "plain", {});
  REQUIRE(plain.exit_code == 0);
  CHECK_FALSE(contains(read_file(temporary.path / "plain" / "gpt3_126m" / "gpt3_126m_submission.sh"),
                       "CUDA_DEVICE_MAX_CONNECTIONS"));
}
