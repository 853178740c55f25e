// A steady clock a test moves by hand, for the watchdogs that take their clock as a function
// (backend/dist/collective_watchdog.hpp, queued_collective_watchdog.hpp).
#pragma once

#include <chrono>
#include <functional>

namespace test_support {

struct FakeClock {
  std::chrono::steady_clock::time_point now{};
  std::function<std::chrono::steady_clock::time_point()> function() {
    return [this] { return now; };
  }
};

}  // namespace test_support
