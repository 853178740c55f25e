// Running the NumPy-based references of the data tests (megatron_dataset_reference.py and
// one-line numpy checks) with Debian's /usr/bin/python3 (python3-numpy). Without numpy a test
// that needs it is skipped with a message, except when the environment variable CI is set,
// where that is a failure (container/install-deps.sh --tests installs python3-numpy).
#pragma once

#include <string>

#include "tests/reference_tools.hpp"
#include "tests/test_files.hpp"

namespace test_support {

// The reference script's command line: python3 megatron_dataset_reference.py <arguments>.
inline std::string dataset_reference(const std::string& arguments) {
  return std::string(kPython) + " " + TEST_SOURCE_DIR +
         "/tests/backend/data/megatron_dataset_reference.py " + arguments;
}

}  // namespace test_support
