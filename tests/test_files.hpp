// Test support: where the tests find the source tree's data and the built executables, and
// whole files read and written, for checking what a tool wrote and giving it input. One copy of
// each, shared by every test file (they also meet in one translation unit in a unity build).
#pragma once

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace test_support {

inline const std::string kTestSource = TEST_SOURCE_DIR;
inline const std::filesystem::path kSourceDir = TEST_SOURCE_DIR;
inline const std::string kTestBin = TEST_BIN_DIR;
inline const std::string kTestData = kTestSource + "/tests/data";
inline const std::string kGpt2Vocab = kTestData + "/gpt2-vocab.json";
inline const std::string kGpt2Merges = kTestData + "/gpt2-merges.txt";
inline const std::string kPretrainGpt = kTestBin + "/pretrain_gpt";
inline const std::string kCheckpointUtil = kTestBin + "/checkpoint_util";
inline const std::string kLauncher = kTestBin + "/launcher";
// The Python the reference implementations run under: Debian's, where python3-torch and
// python3-numpy are installed (a python3 earlier on PATH may lack them).
inline constexpr const char* kPython = "/usr/bin/python3";

// True under CI (CI set, and not "0" or "false"), where a missing reference tool is a failure
// rather than a skip.
inline bool running_under_ci() {
  const char* ci = std::getenv("CI");
  if (ci == nullptr) return false;
  const std::string value = ci;
  return !value.empty() && value != "0" && value != "false";
}

// Whether `text` contains `part`.
inline bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// The last `characters` of a tool's output, for a failure message.
inline std::string output_tail(const std::string& text, size_t characters = 3000) {
  return text.substr(text.size() > characters ? text.size() - characters : 0);
}

// The whole file as bytes; empty when it cannot be opened (the checks on it then fail).
inline std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// Writes `bytes` as the whole file (replacing it); a failure throws, which fails the test.
inline void write_file(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
  out.close();
  if (!out) throw std::runtime_error("could not write " + path.string());
}

// The names in a directory, sorted.
inline std::vector<std::string> directory_entries(const std::filesystem::path& directory) {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(directory)) {
    names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

// "e282ac" -> the bytes E2 82 AC.
inline std::string from_hex(const std::string& hex) {
  std::string bytes;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    bytes.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  }
  return bytes;
}

}  // namespace test_support
