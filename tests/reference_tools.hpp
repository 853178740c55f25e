// The reference implementations the tests compare against (PyTorch, NumPy, Python itself,
// sentencepiece's tools), run as commands: run_command, and reference_available, which says
// whether one is at hand. Without it a test is skipped with a message naming the Debian package,
// except under CI (running_under_ci), where that is a failure: CI installs every reference with
// container/install-deps.sh --tests, so a skip there would hide a comparison that never ran.
#pragma once

#include <doctest/doctest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

#include "tests/test_files.hpp"

namespace test_support {

struct CommandResult {
  int exit_status = -1;
  std::string output;  // stdout and stderr together
};

// `command` run by the shell, its output captured.
inline CommandResult run_command(const std::string& command) {
  CommandResult result;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  REQUIRE_MESSAGE(pipe != nullptr, "cannot run: " << command);
  std::array<char, 4096> buffer{};
  size_t count;
  while ((count = fread(buffer.data(), 1, buffer.size(), pipe)) > 0) {
    result.output.append(buffer.data(), count);
  }
  const int status = pclose(pipe);
  result.exit_status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

// Whether the reference `what` works: `works` says so from the probe command's result. When it
// does not, a skip (MESSAGE) saying why and how to get it (`remedy`), or under CI a failure.
template <typename Works>
bool reference_available(const std::string& probe, const std::string& what,
                         const std::string& remedy, Works works) {
  const CommandResult result = run_command(probe);
  if (works(result)) return true;
  const std::string why = what + " is not at hand (" + remedy + "): " + result.output;
  if (running_under_ci()) FAIL("CI is set, so this may not be skipped: " << why);
  MESSAGE("skipped: " << why);
  return false;
}

// Whether Debian's /usr/bin/python3 imports `modules` ("torch", "torch, numpy"); `packages`
// names the Debian packages that bring them.
inline bool python_imports(const std::string& modules, const std::string& packages) {
  return reference_available(
      std::string(kPython) + " -c 'import " + modules + "'",
      std::string(kPython) + "'s import of " + modules,
      "Debian: apt-get install " + packages + ", or container/install-deps.sh --tests",
      [](const CommandResult& result) { return result.exit_status == 0; });
}

inline bool torch_available() {
  return python_imports("torch", "python3-torch");
}
inline bool numpy_available() {
  return python_imports("numpy", "python3-numpy");
}

}  // namespace test_support
