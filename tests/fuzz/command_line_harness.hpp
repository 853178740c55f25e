// The harness the command-line fuzz targets share: one input is a command line, one argument
// per line ('\n'), argv[0] being the program's name. Each target hands argv to its tool's
// parse-and-validate function, which must end in options, nullopt (--help) or a
// common::Error; any other exception, a crash, a sanitizer report, or a file the parse created
// is a finding. Parsing must have no side effects, so the harness runs in an empty directory
// of its own and checks after each input that nothing appeared there (a relative --save or
// --output-prefix would show).
#pragma once

#include <dirent.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

#include "backend/common/error.hpp"

namespace fuzz_command_line {

[[noreturn]] inline void finding(const std::string& what) {
  std::fprintf(stderr, "FINDING: %s\n", what.c_str());
  std::abort();
}

// Once per process: an empty working directory, --help's text and warnings out of the way.
inline void initialize() {
  char directory[] = "/tmp/command-line-fuzz-XXXXXX";
  if (::mkdtemp(directory) == nullptr || ::chdir(directory) != 0) finding("cannot make a directory");
  if (std::freopen("/dev/null", "w", stdout) == nullptr) finding("cannot silence stdout");
  spdlog::set_level(spdlog::level::off);
}

inline bool working_directory_is_empty() {
  DIR* directory = ::opendir(".");
  if (directory == nullptr) return false;
  bool empty = true;
  while (const dirent* entry = ::readdir(directory)) {
    const std::string_view name = entry->d_name;
    if (name != "." && name != "..") empty = false;
  }
  ::closedir(directory);
  return empty;
}

// Runs `parse(argc, argv)` on the input split into arguments (at most 256 of them).
template <typename Parse>
int run(std::string_view program, const uint8_t* data, size_t size, Parse parse) {
  std::vector<std::string> words{std::string(program)};
  std::string_view rest(reinterpret_cast<const char*>(data), size);
  while (!rest.empty() && words.size() <= 256) {
    const size_t end = rest.find('\n');
    words.emplace_back(rest.substr(0, end));
    rest = end == std::string_view::npos ? std::string_view() : rest.substr(end + 1);
  }
  std::vector<const char*> argv;
  for (const std::string& word : words) argv.push_back(word.c_str());
  try {
    parse(static_cast<int>(argv.size()), argv.data());
  } catch (const common::Error&) {
    // a refusal with a message: what bad input must end in
  } catch (const std::exception& error) {
    finding(std::string(program) + " ended in an internal error: " + error.what());
  }
  if (!working_directory_is_empty()) finding(std::string(program) + "'s parse created a file");
  return 0;
}

}  // namespace fuzz_command_line
