// Test support for the hostile-input e2e tests: a tool run under a time bound, and the check
// that it refused its input as a user error (exit 2, the message, never an internal error).
#pragma once

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "launcher/process.hpp"

namespace test_support {

// `argv` under timeout(1): a tool that hangs on its input fails the test instead of stalling it.
inline launcher::CapturedRun run_bounded(std::vector<std::string> argv) {
  argv.insert(argv.begin(), {"timeout", "60"});
  return launcher::run_and_capture(argv);
}

inline void check_refused(const launcher::CapturedRun& run, const std::string& message) {
  INFO(run.output);
  CHECK(run.exit_code == 2);
  CHECK(run.output.find(message) != std::string::npos);
  CHECK(run.output.find("internal error") == std::string::npos);
}

}  // namespace test_support
