// The queued collectives' watchdog without a GPU: collectives whose state the test sets, a fake
// clock and an action that records, so the rules are checked exactly (finished ones released
// and dropped in order; the first failure or timeout reported once, with its message; forget()
// and the destructor release what is left), then the real thread with a real clock.
#include "backend/dist/queued_collective_watchdog.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "backend/common/error.hpp"
#include "fake_clock.hpp"

using backend::QueuedCollectiveWatchdog;
using namespace std::chrono_literals;
using test_support::FakeClock;

namespace {

// A collective the test finishes or fails, counting its releases.
struct FakeCollective {
  QueuedCollectiveWatchdog::State state;
  int released = 0;
  QueuedCollectiveWatchdog::Collective watched(const std::string& call, const void* owner) {
    return {call, owner, [this] { return state; }, [this] { ++released; }};
  }
};

}  // namespace

TEST_CASE(
    "finished collectives are released and dropped, and one outstanding too long is reported "
    "once") {
  FakeClock clock;
  std::vector<std::string> messages;
  // Declared before the watchdog, whose destructor releases what is still outstanding.
  FakeCollective first, second;
  const int owner = 0;
  QueuedCollectiveWatchdog watchdog(
      "rank 3 (host node2)", 10min, clock.function(),
      [&](const std::string& message) { messages.push_back(message); });
  CHECK_FALSE(watchdog.check());  // nothing outstanding
  watchdog.watch(first.watched("ncclAllReduce in the data parallel group", &owner));
  clock.now += 1min;
  watchdog.watch(
      second.watched("ncclSend/ncclRecv (exchange) in the pipeline parallel group", &owner));
  CHECK(watchdog.outstanding() == 2);
  first.state.done = true;
  CHECK_FALSE(watchdog.check());
  CHECK(first.released == 1);
  CHECK(watchdog.outstanding() == 1);

  // The second was queued a minute later: its 10 minutes end at 11.
  clock.now += 10min;
  CHECK_FALSE(watchdog.check());  // exactly the timeout: not longer
  clock.now += 1ms;
  CHECK(watchdog.check());
  REQUIRE(messages.size() == 1);
  CHECK(messages[0] ==
        "rank 3 (host node2): ncclSend/ncclRecv (exchange) in the pipeline parallel group did not "
        "complete in 10 minutes (--distributed-timeout-minutes 10): another rank has probably "
        "failed or hangs; aborting the job");
  clock.now += 1h;
  CHECK_FALSE(watchdog.check());  // reported once
  CHECK(messages.size() == 1);
  CHECK(second.released == 0);  // not done: still outstanding
  CHECK(first.released == 1);   // released once only
}

TEST_CASE("an asynchronous error is reported at once with its reason, ahead of later ones") {
  FakeClock clock;
  std::vector<std::string> messages;
  FakeCollective running, failing, later;  // before the watchdog (see above)
  const int owner = 0;
  QueuedCollectiveWatchdog watchdog(
      "rank 0 (host a)", 3s, clock.function(),
      [&](const std::string& message) { messages.push_back(message); });
  watchdog.watch(running.watched("ncclAllReduce in the tensor parallel group", &owner));
  watchdog.watch(failing.watched("ncclReduceScatter in the data parallel group", &owner));
  watchdog.watch(later.watched("ncclAllGather in the data parallel group", &owner));
  later.state.failure = "unhandled system error (remote process exited)";
  failing.state.failure = "remote process exited or there was a network error";
  CHECK(watchdog.check());
  REQUIRE(messages.size() == 1);
  CHECK(messages[0] ==
        "rank 0 (host a): ncclReduceScatter in the data parallel group failed: remote process "
        "exited or there was a network error; aborting the job");
  CHECK_FALSE(watchdog.check());
  CHECK(messages.size() == 1);
}

TEST_CASE("forget() releases one communicator's collectives, and the destructor the rest") {
  FakeClock clock;
  int fired = 0;
  FakeCollective mine, theirs;
  const int tensor_parallel = 0, data_parallel = 0;
  {
    QueuedCollectiveWatchdog watchdog("rank 1 (host b)", 1min, clock.function(),
                                      [&](const std::string&) { ++fired; });
    watchdog.watch(mine.watched("ncclAllReduce in the tensor parallel group", &tensor_parallel));
    watchdog.watch(theirs.watched("ncclAllReduce in the data parallel group", &data_parallel));
    watchdog.forget(&tensor_parallel);
    CHECK(mine.released == 1);
    CHECK(theirs.released == 0);
    CHECK(watchdog.outstanding() == 1);
    // A forgotten collective is not looked at again, even when it would have timed out.
    clock.now += 2min;
    theirs.state.done = true;
    CHECK_FALSE(watchdog.check());
    CHECK(theirs.released == 1);
    watchdog.watch(mine.watched("ncclBroadcast in the tensor parallel group", &tensor_parallel));
  }
  CHECK(mine.released == 2);  // by the destructor
  CHECK(fired == 0);
}

TEST_CASE("the watching thread reports a failure within a few periods, and stops") {
  std::atomic<int> fired{0};
  QueuedCollectiveWatchdog watchdog(
      "rank 0 (host a)", 10min, [] { return std::chrono::steady_clock::now(); },
      [&](const std::string&) { ++fired; });
  auto failed = std::make_shared<std::atomic<bool>>(false);
  const int owner = 0;
  watchdog.watch({"ncclAllReduce in the world group",
                  &owner,
                  [failed] {
                    QueuedCollectiveWatchdog::State state;
                    if (*failed) state.failure = "an error";
                    return state;
                  },
                  {}});
  watchdog.start(5ms);
  std::this_thread::sleep_for(30ms);
  CHECK(fired == 0);
  *failed = true;
  for (int i = 0; i < 200 && fired == 0; ++i) std::this_thread::sleep_for(5ms);
  CHECK(fired == 1);
  watchdog.stop();
  watchdog.stop();  // twice is fine
}

TEST_CASE("a watchdog without a positive timeout is refused") {
  CHECK_THROWS_WITH_AS(QueuedCollectiveWatchdog(
                           "rank 0", 0ms, [] { return std::chrono::steady_clock::now(); },
                           [](const std::string&) {}),
                       doctest::Contains("positive timeout"), common::Error);
}
