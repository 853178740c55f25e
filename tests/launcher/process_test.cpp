// Running children without a shell: output captured, exit codes passed on, and a program that
// cannot be started is a clear error naming it, in the foreground and detached alike.
#include <doctest/doctest.h>

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <sstream>
#include <thread>

#include "backend/common/error.hpp"
#include "launcher/process.hpp"
#include "temporary_directory.hpp"
#include "test_files.hpp"

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

TEST_CASE("run_and_tee with a time limit passes a Ctrl-C sent to the launcher on to the job") {
  // The job leads its own process group, so the terminal's SIGINT reaches only this process;
  // before the fix the job ran on, orphaned, after the launcher died.
  test_support::TemporaryDirectory temporary;
  const std::filesystem::path log = temporary.path / "interrupted.log";
  std::ostringstream terminal;
  // A process started in the background by a non-interactive shell (as CI may start the suite)
  // inherits SIGINT ignored, which run_and_tee respects (nohup); here it must be the default.
  std::signal(SIGINT, SIG_DFL);
  std::thread sender([&] {
    // The handlers are in place before the job starts, so once it has printed, the signal is
    // caught; without that line the signal is not sent (the test then fails, not the process).
    for (int i = 0; i < 400; ++i) {
      if (std::filesystem::exists(log) && test_support::read_file(log) == "started\n") {
        kill(getpid(), SIGINT);
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
  });
  const auto started = std::chrono::steady_clock::now();
  const launcher::TeedRun run = launcher::run_and_tee(
      {"bash", "-c", "echo started; sleep 30"}, [&](int) { return log; }, terminal,
      std::chrono::milliseconds(60'000));
  sender.join();
  CHECK(run.interrupted_by == SIGINT);
  CHECK_FALSE(run.timed_out);
  CHECK(run.exit_code == 128 + SIGINT);
  // Passed on at once: well before the 5 s grace that would end in SIGKILL.
  CHECK(std::chrono::steady_clock::now() - started < std::chrono::seconds(4));
  // The handlers are gone again: SIGINT's disposition is what it was (the default here).
  struct sigaction now {};
  sigaction(SIGINT, nullptr, &now);
  const bool default_again = now.sa_handler == SIG_DFL;
  CHECK(default_again);
}
