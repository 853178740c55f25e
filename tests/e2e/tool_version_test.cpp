// Every executable answers --version with the project's version, the launcher's words exactly,
// so a job log or a bug report can say which build ran.
#include <doctest/doctest.h>

#include <string>

#include "launcher/process.hpp"
#include "test_files.hpp"

TEST_CASE("every tool prints the launcher's version for --version") {
  const auto launcher = launcher::run_and_capture({test_support::kLauncher, "--version"});
  REQUIRE(launcher.exit_code == 0);
  CHECK(launcher.output == std::string(PROJECT_VERSION_STRING) + "\n");
  for (const char* tool : {"pretrain_gpt", "evaluate_gpt", "text_generation_server",
                           "text_generation_cli", "preprocess_data", "download", "decompress",
                           "checkpoint_util"}) {
    CAPTURE(tool);
    const auto run = launcher::run_and_capture({test_support::kTestBin + "/" + tool, "--version"});
    CHECK(run.exit_code == 0);
    CHECK(run.output == launcher.output);
  }
}
