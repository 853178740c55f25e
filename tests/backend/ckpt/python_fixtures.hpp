// The checkpoints a fixture script of tests/backend/ckpt writes with Debian's Python and
// PyTorch (write_megatron_checkpoints.py, write_torch_dist_checkpoints.py,
// write_nemo_archives.py), made once per build and shared by the test processes, and the refusal
// a reader gives, and the JSON a script of theirs prints: for the tests of the readers and
// writers of other tools' checkpoints. The tests read the fixtures and copy what they damage.
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
#include "tests/build_cache.hpp"
#include "tests/reference_tools.hpp"
#include "tests/temporary_directory.hpp"
#include "tests/test_files.hpp"

namespace test_support {

// The directory tests/backend/ckpt/`script` wrote its checkpoints into (the script's one
// argument), written once per build and text of the Python files there (tests/build_cache.hpp:
// each script takes seconds of PyTorch, and CTest runs each test case as a process);
// nullptr when Python lacks `modules` (the test is skipped, python_imports saying so and naming
// the Debian `packages`, except under CI). The script failing fails the test.
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
  // The stamp: the script and the Python files beside it, which it may import.
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
  const BuildCacheEntry written = made_once_per_build(
      script, fmt::format("{:016x}", std::hash<std::string>{}(text)),
      [&](const fs::path& directory, std::string& output) {
        const auto result = run_command(std::string(kPython) + " " + script_path.string() + " " +
                                        directory.string());
        output = result.output;
        return result.exit_status == 0;
      });
  REQUIRE_MESSAGE(written.ok, written.output);
  return fixtures.emplace(script, std::make_unique<fs::path>(written.directory))
      .first->second.get();
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
