// Test support: reading a flag back from a command line a stage built.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

namespace test_support {

// The word after `flag`, or "<absent>".
inline std::string flag_value(const std::vector<std::string>& arguments, const std::string& flag) {
  for (size_t i = 0; i + 1 < arguments.size(); ++i) {
    if (arguments[i] == flag) return arguments[i + 1];
  }
  return "<absent>";
}

inline bool has(const std::vector<std::string>& arguments, const std::string& flag) {
  return std::find(arguments.begin(), arguments.end(), flag) != arguments.end();
}

}  // namespace test_support
