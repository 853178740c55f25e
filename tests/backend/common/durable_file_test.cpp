// common::write_text_file_atomically, the one "temporary, fsync, rename" writer: the launcher's
// scripts and configs and the backend's trackers and caches. Crash safety itself is tested by
// killing real processes (tests/e2e/checkpoint_kill_test.cpp, preprocess_kill_test.cpp).
#include "backend/common/durable_file.hpp"

#include <doctest/doctest.h>

#include <filesystem>
#include <string>

#include "backend/common/error.hpp"
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
