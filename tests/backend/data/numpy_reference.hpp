// Running the NumPy-based references of the data tests (megatron_dataset_reference.py and
// one-line numpy checks) with Debian's /usr/bin/python3 (python3-numpy). Without numpy a test
// that needs it is skipped with a message, except when the environment variable CI is set,
// where that is a failure (container/install-deps.sh --tests installs python3-numpy).
#pragma once

#include <doctest/doctest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "test_files.hpp"

namespace test_support {

struct CommandResult {
  int exit_status = -1;
  std::string output;
};

inline CommandResult run_command(const std::string& command) {
  CommandResult result;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  REQUIRE_MESSAGE(pipe != nullptr, "cannot run: " << command);
  std::array<char, 4096> buffer{};
  size_t count;
  while ((count = fread(buffer.data(), 1, buffer.size(), pipe)) > 0) result.output.append(buffer.data(), count);
  const int status = pclose(pipe);
  result.exit_status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

// True when /usr/bin/python3 imports numpy; otherwise skips (MESSAGE) or, under CI, fails.
inline bool numpy_available() {
  const auto probe = run_command(std::string(kPython) + " -c 'import numpy'");
  if (probe.exit_status == 0) return true;
  const std::string why = std::string(kPython) + " cannot import numpy (Debian: apt-get install " +
                          "python3-numpy, or container/install-deps.sh --tests): " + probe.output;
  if (std::getenv("CI") != nullptr) FAIL("CI is set, so the numpy reference may not be skipped: " << why);
  MESSAGE("skipped: " << why);
  return false;
}

// The reference script's command line: python3 megatron_dataset_reference.py <arguments>.
inline std::string dataset_reference(const std::string& arguments) {
  return std::string(kPython) + " " + TEST_SOURCE_DIR +
         "/tests/backend/data/megatron_dataset_reference.py " + arguments;
}

}  // namespace test_support
