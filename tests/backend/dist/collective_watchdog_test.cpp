// The collective watchdog without MPI: a fake clock and an action that records, so the rules
// are checked exactly (a call fires once, and only after it has waited longer than the timeout;
// time between calls never counts; the message names rank, host, operation, group and flag),
// then the real thread with a real clock and a short period.
#include "backend/dist/collective_watchdog.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "backend/common/error.hpp"
#include "fake_clock.hpp"

using backend::CollectiveWatchdog;
using namespace std::chrono_literals;
using test_support::FakeClock;

TEST_CASE("a call fires once, when it has waited longer than the timeout, with the message") {
  FakeClock clock;
  std::vector<std::string> messages;
  CollectiveWatchdog watchdog("rank 3 (host node2)", clock.function(),
                              [&](const std::string& message) { messages.push_back(message); });
  CHECK(watchdog.timeout_minutes() == 10);  // Megatron's default
  CHECK_FALSE(watchdog.check());            // no call in progress

  watchdog.begin("MPI_Allreduce", "data parallel");
  clock.now += 10min;
  CHECK_FALSE(watchdog.check());  // exactly the timeout: not longer
  clock.now += 1ms;
  CHECK(watchdog.check());
  REQUIRE(messages.size() == 1);
  CHECK(messages[0] ==
        "rank 3 (host node2): MPI_Allreduce in the data parallel group did not complete in 10 "
        "minutes (--distributed-timeout-minutes 10): another rank has probably failed or hangs; "
        "aborting the job");
  clock.now += 1h;
  CHECK_FALSE(watchdog.check());  // reported once per call
  watchdog.end();
  CHECK(messages.size() == 1);
}

TEST_CASE("only the time inside one call counts, never the time between calls") {
  FakeClock clock;
  int fired = 0;
  CollectiveWatchdog watchdog("rank 0 (host a)", clock.function(),
                              [&](const std::string&) { ++fired; }, 0.05);  // 3 s
  for (int call = 0; call < 5; ++call) {
    watchdog.begin("MPI_Barrier", "world");
    clock.now += 2s;
    CHECK_FALSE(watchdog.check());
    watchdog.end();
    clock.now += 1h;  // a long computation between calls
    CHECK_FALSE(watchdog.check());
  }
  CHECK(fired == 0);
  {
    const auto call = watchdog.watch("MPI_Reduce_scatter", "data parallel");
    clock.now += 3001ms;
    CHECK(watchdog.check());
  }
  CHECK(fired == 1);
  clock.now += 1h;
  CHECK_FALSE(watchdog.check());  // the Call ended it
  // A new call after a reported one is watched afresh.
  watchdog.begin("MPI_Allgatherv", "data parallel");
  clock.now += 4s;
  CHECK(watchdog.check());
  CHECK(fired == 2);
}

TEST_CASE("the timeout set from the flag applies, to the call in progress too") {
  FakeClock clock;
  std::string last;
  CollectiveWatchdog watchdog("rank 1 (host node7)", clock.function(),
                              [&](const std::string& message) { last = message; });
  watchdog.begin("MPI_Recv", "pipeline model parallel", 5);
  clock.now += 2s;
  CHECK_FALSE(watchdog.check());
  watchdog.set_timeout_minutes(0.025);  // 1.5 s
  CHECK(watchdog.timeout_minutes() == 0.025);
  CHECK(watchdog.check());
  CHECK(last ==
        "rank 1 (host node7): MPI_Recv with rank 5 in the pipeline model parallel group did not "
        "complete in 1.5 seconds (--distributed-timeout-minutes 0.025): another rank has probably "
        "failed or hangs; aborting the job");
  watchdog.end();

  watchdog.set_timeout_minutes(1.5);
  watchdog.begin("MPI_Bcast", "world");
  clock.now += 91s;
  CHECK(watchdog.check());
  CHECK(last.find("MPI_Bcast in the world group did not complete in 1.5 minutes "
                  "(--distributed-timeout-minutes 1.5)") != std::string::npos);
  watchdog.end();

  // A timeout beyond what the clock counts never fires (and does not overflow).
  watchdog.set_timeout_minutes(1e300);
  watchdog.begin("MPI_Barrier", "world");
  clock.now += std::chrono::hours(24 * 365 * 100);
  CHECK_FALSE(watchdog.check());
  watchdog.end();
}

TEST_CASE("looks every period fire after the timeout — time this process was frozen does not count") {
  FakeClock clock;
  int fired = 0;
  CollectiveWatchdog watchdog("rank 1 (host b)", clock.function(),
                              [&](const std::string&) { ++fired; }, 0.05);  // 3 s
  auto look = [&](std::chrono::milliseconds after) {
    clock.now += after;
    return watchdog.tick(1s);
  };
  // Regular looks: fires at the first look past 3 s.
  watchdog.begin("MPI_Allreduce", "data parallel");
  CHECK_FALSE(look(1s));
  CHECK_FALSE(look(1s));
  CHECK_FALSE(look(1s));  // exactly 3 s
  CHECK(look(1s));
  watchdog.end();
  CHECK(fired == 1);

  // Stopped for a minute in the middle of a call (SIGSTOP, then SIGCONT): the minute is this
  // process's own, so the call has waited 1 s + one period, then counts on.
  watchdog.begin("MPI_Allreduce", "data parallel");
  CHECK_FALSE(look(1s));
  CHECK_FALSE(look(60s));
  CHECK_FALSE(look(1s));  // 3 s
  CHECK(look(1s));
  watchdog.end();
  CHECK(fired == 2);

  // Frozen between calls: nothing to take out of the next call.
  CHECK_FALSE(look(1s));
  CHECK_FALSE(look(120s));
  watchdog.begin("MPI_Barrier", "world");
  CHECK_FALSE(look(1s));
  CHECK_FALSE(look(2s));  // a late look (2 periods: not frozen) at exactly 3 s
  CHECK(look(1s));
  watchdog.end();
  CHECK(fired == 3);

  // A call that begins while the watching thread was held up loses only its own part.
  CHECK_FALSE(look(1s));
  clock.now += 10s;  // the watching thread did not run ...
  watchdog.begin("MPI_Bcast", "world");
  clock.now += 5s;   // ... before the call nor during its first 5 s (4 of them beyond a period)
  CHECK_FALSE(watchdog.tick(1s));  // counted: 1 s
  CHECK_FALSE(look(1s));
  CHECK_FALSE(look(1s));
  CHECK(look(1s));
  CHECK(fired == 4);
}

TEST_CASE("a timeout that is not a positive number of minutes is refused, naming the flag") {
  FakeClock clock;
  CollectiveWatchdog watchdog("rank 0 (host a)", clock.function(), [](const std::string&) {});
  for (const double minutes : {0.0, -1.0, std::numeric_limits<double>::infinity(),
                               std::numeric_limits<double>::quiet_NaN()}) {
    CAPTURE(minutes);
    CHECK_THROWS_WITH_AS(watchdog.set_timeout_minutes(minutes),
                         doctest::Contains("--distributed-timeout-minutes"), common::Error);
  }
  CHECK(watchdog.timeout_minutes() == 10);  // unchanged
  CHECK_THROWS_AS(CollectiveWatchdog("x", clock.function(), [](const std::string&) {}, 0),
                  common::Error);
}

TEST_CASE("format_timeout says minutes, or seconds below one") {
  CHECK(backend::format_timeout(10) == "10 minutes");
  CHECK(backend::format_timeout(1) == "1 minute");
  CHECK(backend::format_timeout(2.5) == "2.5 minutes");
  CHECK(backend::format_timeout(0.05) == "3 seconds");
  CHECK(backend::format_timeout(0.5) == "30 seconds");
  CHECK(backend::format_timeout(1.0 / 60) == "1 second");
}

TEST_CASE("the watching thread finds a call that waits too long, and stops promptly") {
  std::atomic<int> fired{0};
  std::string message;
  std::atomic<bool> message_ready{false};
  CollectiveWatchdog watchdog(
      "rank 2 (host h)", CollectiveWatchdog::Clock::now,
      [&](const std::string& text) {
        if (fired.fetch_add(1) == 0) {
          message = text;
          message_ready = true;
        }
      },
      0.01);  // 600 ms
  watchdog.start(10ms);
  // Calls shorter than the timeout, with long pauses between them: nothing fires.
  for (int call = 0; call < 3; ++call) {
    {
      const auto watched = watchdog.watch("MPI_Allreduce", "world");
      std::this_thread::sleep_for(20ms);
    }
    std::this_thread::sleep_for(200ms);
  }
  CHECK(fired == 0);
  {
    const auto watched = watchdog.watch("MPI_Barrier", "world");
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    while (!message_ready && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(5ms);
    }
  }
  CHECK(fired == 1);
  REQUIRE(message_ready);
  CHECK(message.starts_with("rank 2 (host h): MPI_Barrier in the world group did not complete"));
  // stop() wakes the thread instead of waiting out its period.
  watchdog.start(std::chrono::hours(1));
  const auto stopping = std::chrono::steady_clock::now();
  watchdog.stop();
  CHECK(std::chrono::steady_clock::now() - stopping < 5s);
}
