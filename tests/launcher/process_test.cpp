// Running children without a shell: output captured, exit codes passed on, and a program that
// cannot be started is a clear error naming it, in the foreground and detached alike.
#include <doctest/doctest.h>

#include "backend/common/error.hpp"
#include "launcher/process.hpp"

TEST_CASE("output and exit status of a child come back — a missing program is named") {
  const auto run = launcher::run_and_capture({"bash", "-c", "echo out; echo err >&2; exit 3"});
  CHECK(run.exit_code == 3);
  CHECK(run.output.find("out") != std::string::npos);
  CHECK(run.output.find("err") != std::string::npos);
  CHECK_THROWS_WITH_AS(launcher::run_and_capture({"no-such-program-megatron-native"}),
                       doctest::Contains("cannot run no-such-program-megatron-native"),
                       common::Error);
  CHECK_THROWS_WITH_AS(launcher::start_detached({"no-such-program-megatron-native"}),
                       doctest::Contains("cannot run no-such-program-megatron-native"),
                       common::Error);
  CHECK_THROWS_AS(launcher::run_and_capture({}), common::Error);
}
