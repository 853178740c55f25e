// Results directories: the checks on names and paths made before anything is created, the
// exclusive lock a launch takes (flock locks belong to an open file, so two locks in one
// process conflict as two launchers would), and atomic file writes.
#include "launcher/results_dir.hpp"

#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "backend/common/error.hpp"
#include "temporary_directory.hpp"
#include "test_files.hpp"

namespace fs = std::filesystem;

namespace {

using test_support::read_file;

}  // namespace

TEST_CASE("names that become file names: one file name, at most 200 bytes") {
  CHECK_NOTHROW(launcher::check_file_name_part("gpt3_126m", "training.run.name"));
  CHECK_NOTHROW(launcher::check_file_name_part("x'y; $(touch z) é", "training.run.name"));
  CHECK_NOTHROW(launcher::check_file_name_part(std::string(200, 'a'), "training.run.name"));
  const std::vector<std::pair<std::string, std::string>> refused = {
      {"", "training.run.name is empty"},
      {"a/b", "training.run.name 'a/b' contains '/': it becomes file names"},
      {"a/b/c", "use e.g. 'a_b_c'"},
      {std::string("a\0b", 3), "training.run.name 'a\\x00b' contains a NUL byte"},
      {".", "'.' is not a usable file name"},
      {"..", "'..' is not a usable file name"},
      {std::string(201, 'a'), "is longer than 200 bytes"},
      {std::string(100'000, 'a'), "(100000 bytes)' is longer than 200 bytes"},
  };
  for (const auto& [name, message] : refused) {
    // A copy: clang 14 (the asan preset) cannot refer to a structured binding in CAPTURE's lambda.
    const auto& captured_message = message;
    CAPTURE(captured_message);
    CHECK_THROWS_WITH_AS(launcher::check_file_name_part(name, "training.run.name"),
                         doctest::Contains(message.c_str()), common::Error);
  }
}

TEST_CASE("directories to create: not empty, within Linux's limits, no file in the way") {
  test_support::TemporaryDirectory temporary;
  CHECK_NOTHROW(launcher::check_directory_path(temporary.path / "a" / "b", "k"));
  CHECK_NOTHROW(launcher::check_directory_path("relative/results", "k"));
  CHECK_THROWS_WITH_AS(launcher::check_directory_path("", "training.run.results_dir"),
                       doctest::Contains("training.run.results_dir is empty"), common::Error);
  CHECK_THROWS_WITH_AS(launcher::check_directory_path(temporary.path / std::string(256, 'x'), "k"),
                       doctest::Contains("is longer than 255 bytes"), common::Error);
  fs::path deep = temporary.path;
  while (deep.native().size() <= 4095) deep /= std::string(200, 'd');
  CHECK_THROWS_WITH_AS(launcher::check_directory_path(deep, "k"),
                       doctest::Contains("is longer than 4095 bytes"), common::Error);
  std::ofstream(temporary.path / "file") << "x";
  CHECK_THROWS_WITH_AS(
      launcher::check_directory_path(temporary.path / "file" / "a" / "b", "base_results_dir"),
      doctest::Contains(
          ((temporary.path / "file").string() + " exists and is not a directory").c_str()),
      common::Error);
  CHECK_THROWS_WITH_AS(
      launcher::create_results_dir(temporary.path / "file" / "a", "training.run.results_dir"),
      doctest::Contains("training.run.results_dir: cannot create the results directory"),
      common::Error);
  // Where the file system refuses (root included): the setting to change is named.
  CHECK_THROWS_WITH_AS(
      launcher::create_results_dir("/sys/launcher_results/run", "training.run.results_dir"),
      doctest::Contains("set base_results_dir=DIR (where every run's results go) or "
                        "training.run.results_dir to a directory this user can write"),
      common::Error);
  CHECK_THROWS_WITH_AS(
      launcher::create_unique_directory("/sys/launcher_results", "the autoconfig run directory"),
      doctest::Contains("the autoconfig run directory: cannot create the results directory "
                        "/sys/launcher_results: "),
      common::Error);
  launcher::create_results_dir(temporary.path / "new" / "dir", "k");
  CHECK(fs::is_directory(temporary.path / "new" / "dir"));
}

TEST_CASE("a results directory is taken by one lock at a time, which names its holder") {
  test_support::TemporaryDirectory temporary;
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  std::optional<launcher::ResultsDirLock> first(std::in_place, temporary.path);
  const std::string holder = read_file(temporary.path / launcher::ResultsDirLock::kFileName);
  CHECK(holder.starts_with("launcher pid " + std::to_string(getpid()) + " on host " + host +
                           ", since "));
  CHECK_THROWS_WITH_AS(
      launcher::ResultsDirLock(temporary.path),
      doctest::Contains((temporary.path.string() + " is in use by launcher pid " +
                         std::to_string(getpid()) + " on host " + host)
                            .c_str()),
      common::Error);
  first.reset();  // released: the next launch takes it
  CHECK_NOTHROW(launcher::ResultsDirLock(temporary.path));
  CHECK_THROWS_WITH_AS(launcher::ResultsDirLock(temporary.path / "missing"),
                       doctest::Contains("cannot open the lock file"), common::Error);
}
