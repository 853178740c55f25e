// Whether a shared library is mapped into this test process (/proc/self/maps): the tests of
// the GPU libraries loaded on demand (cuBLASLt, cuDNN) check that nothing loaded them early.
#pragma once

#include <fstream>
#include <string>

namespace test_support {

// Whether a file whose name contains `name` is mapped into this process.
inline bool mapped_into_process(const std::string& name) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    if (line.find(name) != std::string::npos) return true;
  }
  return false;
}

}  // namespace test_support
