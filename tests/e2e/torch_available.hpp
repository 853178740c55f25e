// Whether Debian's /usr/bin/python3 can import torch, for the e2e tests that compare with a
// PyTorch reference: true, or a skip with a message naming the package; under CI (CI set) a
// missing torch fails instead, since CI installs it (container/install-deps.sh --tests).
// Header-only because tests/CMakeLists.txt compiles only *_test.cpp.
#pragma once

#include <doctest/doctest.h>

#include <cstdlib>
#include <string>

#include "launcher/process.hpp"

namespace test_support {

inline constexpr const char* kPython3 = "/usr/bin/python3";

inline bool torch_available(const std::string& what = "the PyTorch reference comparison") {
  const auto probe = launcher::run_and_capture({kPython3, "-c", "import torch"});
  if (probe.exit_code == 0) return true;
  const std::string why = std::string(kPython3) + " cannot import torch (Debian: apt-get install " +
                          "python3-torch, or container/install-deps.sh --tests): " + probe.output;
  if (std::getenv("CI") != nullptr) FAIL("CI is set, so " << what << " may not be skipped: " << why);
  MESSAGE("skipped " << what << ": " << why);
  return false;
}

}  // namespace test_support
