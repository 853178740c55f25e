// The checkpoints a fixture script of tests/backend/ckpt writes with Debian's Python and
// PyTorch (write_megatron_checkpoints.py, write_torch_dist_checkpoints.py,
// write_nemo_archives.py), made once per build and script text and shared by the test processes
// (CTest runs each test case in a process of its own, and each script takes seconds of
// PyTorch), and the refusal a reader gives, and the JSON a script of theirs prints: for the
// tests of the readers and writers of other tools' checkpoints. The tests read the fixtures and
// copy what they damage.
#pragma once

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "backend/common/error.hpp"
#include "tests/reference_tools.hpp"
#include "tests/temporary_directory.hpp"
#include "tests/test_files.hpp"

namespace test_support {

// The directory tests/backend/ckpt/`script` wrote its checkpoints into (the script's one
// argument): <build>/test-fixtures/<script>-<hash of its text and its neighbours'>, written by
// the first test process that needs it into a directory of its own and renamed into place whole,
// so a process finds it complete or not at all (two that race both write; one rename wins, the
// other's copy is removed). nullptr when Python lacks `modules` (the test is skipped,
// python_imports saying so and naming the Debian `packages`, except under CI). The script
// failing fails the test.
inline const std::filesystem::path* python_fixtures(const std::string& script, const char* modules,
                                                    const char* packages) {
  namespace fs = std::filesystem;
  static std::map<std::string, std::unique_ptr<fs::path>> fixtures;
  auto found = fixtures.find(script);
  if (found != fixtures.end()) return found->second.get();
  if (!python_imports(modules, packages)) {
    fixtures.emplace(script, nullptr);
    return nullptr;
  }
  // The script and the Python files beside it, which it may import.
  const fs::path scripts = kSourceDir / "tests" / "backend" / "ckpt";
  const fs::path script_path = scripts / script;
  REQUIRE_MESSAGE(fs::is_regular_file(script_path), "no fixture script " << script_path);
  std::set<fs::path> sources{script_path};
  for (const auto& entry : fs::directory_iterator(scripts)) {
    if (entry.path().extension() == ".py") sources.insert(entry.path());
  }
  std::string text;
  for (const auto& source : sources) {
    std::ifstream file(source, std::ios::binary);
    text +=
        source.filename().string() + '\n' + std::string{std::istreambuf_iterator<char>(file), {}};
  }
  const fs::path cache = fs::path(kTestBin).parent_path() / "test-fixtures";
  fs::create_directories(cache);
  const fs::path directory =
      cache / fmt::format("{}-{:016x}", script, std::hash<std::string>{}(text));
  if (!fs::exists(directory)) {
    TemporaryDirectory written(script + ".partial", cache);
    const auto result = run_command(std::string(kPython) + " " + script_path.string() + " " +
                                    written.path.string());
    REQUIRE_MESSAGE(result.exit_status == 0, result.output);
    std::error_code lost_the_race;  // another process renamed its copy first: that one serves
    fs::rename(written.path, directory, lost_the_race);
    REQUIRE_MESSAGE(fs::exists(directory), "no fixtures at " << directory);
  }
  return fixtures.emplace(script, std::make_unique<fs::path>(directory)).first->second.get();
}

// The JSON tests/backend/ckpt/`script` prints given `arguments` (a reader or a check written in
// Python); the script failing fails the test.
inline nlohmann::json python_json(const std::string& script, const std::string& arguments) {
  const auto result = run_command(std::string(kPython) + " " + kTestSource +
                                  "/tests/backend/ckpt/" + script + " " + arguments);
  REQUIRE_MESSAGE(result.exit_status == 0, result.output);
  return nlohmann::json::parse(result.output);
}

// The message of the common::Error `run` throws; a test failure when it throws none.
inline std::string refusal_of(const std::function<void()>& run) {
  try {
    run();
  } catch (const common::Error& error) {
    return error.what();
  }
  FAIL("expected a refusal");
  return "";
}

}  // namespace test_support
