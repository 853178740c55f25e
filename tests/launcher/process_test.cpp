// Running children without a shell: output captured, exit codes passed on, and a program that
// cannot be started is a clear error naming it, in the foreground and detached alike.
#include <doctest/doctest.h>

#include <csignal>
#include <chrono>
#include <sstream>

#include "backend/common/error.hpp"
#include "launcher/process.hpp"
#include "read_file.hpp"
#include "temporary_directory.hpp"

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

TEST_CASE("run_and_tee with a time limit stops the job and what it started, and says so") {
  test_support::TemporaryDirectory temporary;
  std::ostringstream terminal;
  const auto started = std::chrono::steady_clock::now();
  // The script's child keeps the pipe open: only signalling the whole group ends it in time.
  const launcher::TeedRun stopped = launcher::run_and_tee(
      {"bash", "-c", "echo started; sleep 30 & wait"},
      [&](int) { return temporary.path / "stopped.log"; }, terminal, std::chrono::milliseconds(300));
  CHECK(stopped.timed_out);
  CHECK(stopped.exit_code == 128 + SIGTERM);
  CHECK(std::chrono::steady_clock::now() - started < std::chrono::seconds(5));
  CHECK(terminal.str() == "started\n");
  CHECK(test_support::read_file(temporary.path / "stopped.log") == "started\n");

  const launcher::TeedRun finished = launcher::run_and_tee(
      {"bash", "-c", "echo done; exit 3"}, [&](int) { return temporary.path / "finished.log"; },
      terminal, std::chrono::milliseconds(20'000));
  CHECK_FALSE(finished.timed_out);
  CHECK(finished.exit_code == 3);
}
