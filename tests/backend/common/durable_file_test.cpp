// common::write_text_file_atomically, the one "temporary, fsync, rename" writer: the launcher's
// scripts and configs and the backend's trackers and caches. Crash safety itself is tested by
// killing real processes (tests/e2e/checkpoint_kill_test.cpp, preprocess_kill_test.cpp).
#include "backend/common/durable_file.hpp"

#include <doctest/doctest.h>

#include <filesystem>
#include <string>

#include "backend/common/error.hpp"
#include "hostile_outputs.hpp"
#include "temporary_directory.hpp"
#include "test_files.hpp"

namespace fs = std::filesystem;
using test_support::read_file;

TEST_CASE("write_text_file_atomically replaces the file whole and leaves nothing else") {
  test_support::TemporaryDirectory temporary;
  const fs::path file = temporary.path / "config_hydra.yaml";
  common::write_text_file_atomically(file, "a: 1\n");
  common::write_text_file_atomically(file, "b: 2\n");
  CHECK(read_file(file) == "b: 2\n");
  CHECK((fs::status(file).permissions() & fs::perms::owner_exec) == fs::perms::none);
  // A name near the 255-byte limit: the temporary name does not grow from it.
  const fs::path long_name = temporary.path / (std::string(250, 'n') + ".yaml");
  common::write_text_file_atomically(long_name, "x");
  CHECK(read_file(long_name) == "x");
  int entries = 0;
  for ([[maybe_unused]] const auto& entry : fs::directory_iterator(temporary.path)) ++entries;
  CHECK(entries == 2);
  CHECK_THROWS_WITH_AS(common::write_text_file_atomically(temporary.path / "no" / "file", "x"),
                       doctest::Contains(
                           ("cannot write " + (temporary.path / "no" / "file").string()).c_str()),
                       common::Error);
}

TEST_CASE("write_text_file_atomically: an executable file is executable by owner and group") {
  test_support::TemporaryDirectory temporary;
  const fs::path script = temporary.path / "run_submission.sh";
  common::write_text_file_atomically(script, "#!/bin/bash\n", common::FileMode::executable);
  CHECK(read_file(script) == "#!/bin/bash\n");
  const fs::perms permissions = fs::status(script).permissions();
  CHECK((permissions & fs::perms::owner_exec) != fs::perms::none);
  CHECK((permissions & fs::perms::group_exec) != fs::perms::none);
}

TEST_CASE("output_target: a device, FIFO, directory or broken link is refused, never replaced") {
  // As root, `launcher report --html /dev/full` used to replace /dev/full by the page.
  test_support::TemporaryDirectory temporary;
  for (const auto& hostile : test_support::make_hostile_outputs(temporary.path)) {
    const std::string refusal = "cannot write --html " + hostile.path + ": " + hostile.refusal;
    CHECK_THROWS_WITH_AS(common::output_target(hostile.path, "--html"),
                         doctest::Contains(refusal.c_str()), common::Error);
    CHECK_THROWS_WITH_AS(common::write_text_file_atomically(hostile.path, "page",
                                                            common::FileMode::regular, "--html"),
                         doctest::Contains(refusal.c_str()), common::Error);
    CHECK_THROWS_WITH_AS(common::replaceable_output_file(hostile.path, "--output"),
                         doctest::Contains(hostile.refusal.c_str()), common::Error);
    test_support::check_unchanged(hostile);
  }
  CHECK_THROWS_WITH_AS(common::output_target("", "--html"),
                       doctest::Contains("cannot write --html: the path is empty"), common::Error);
}

TEST_CASE("output_target: a link to a regular file has the file replaced, the link stays") {
  test_support::TemporaryDirectory temporary;
  const fs::path elsewhere = temporary.path / "elsewhere";
  fs::create_directories(elsewhere);
  test_support::write_file(elsewhere / "target.json", "old");
  // A chain of two links, the second relative.
  fs::create_symlink(elsewhere / "target.json", elsewhere / "near");
  fs::create_symlink("elsewhere/near", temporary.path / "link.json");
  CHECK(common::output_target(temporary.path / "link.json", "--results-json").file ==
        fs::canonical(elsewhere / "target.json"));
  common::write_text_file_atomically(temporary.path / "link.json", "new");
  CHECK(fs::is_symlink(temporary.path / "link.json"));
  CHECK(fs::is_symlink(elsewhere / "near"));
  CHECK(read_file(elsewhere / "target.json") == "new");
  // The temporary was made beside the target, and is gone.
  int entries = 0;
  for ([[maybe_unused]] const auto& entry : fs::directory_iterator(elsewhere)) ++entries;
  CHECK(entries == 2);
  CHECK(common::replaceable_output_file(temporary.path / "link.json", "--output") ==
        fs::canonical(elsewhere / "target.json"));
  // A new path and a regular file are themselves.
  CHECK(common::output_target(temporary.path / "new.json", "--x").file ==
        temporary.path / "new.json");
  CHECK(common::output_target(temporary.path / "new.json", "--x").standard_stream == -1);
}

TEST_CASE("output_target: this process's standard output or error is written through") {
  // /proc/self/fd/1 is descriptor 1 whatever it is (a terminal, a pipe, a file): never renamed
  // over (as root, --results-json /dev/stdout used to replace the system's /dev/stdout link).
  CHECK(common::output_target("/proc/self/fd/1", "--results-json").standard_stream == 1);
  CHECK(common::output_target("/proc/self/fd/2", "--results-json").standard_stream >= 1);
  CHECK_THROWS_WITH_AS(common::replaceable_output_file("/proc/self/fd/1", "--output"),
                       doctest::Contains("cannot write --output /proc/self/fd/1: it is this "
                                         "process's standard output"),
                       common::Error);
}
