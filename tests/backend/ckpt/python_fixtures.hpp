// The checkpoints a fixture script of tests/backend/ckpt writes with Debian's Python and
// PyTorch (write_megatron_checkpoints.py, write_torch_dist_checkpoints.py,
// write_nemo_archives.py), made once per test process and script, and the refusal a reader
// gives, and the JSON a script of theirs prints: for the tests of the readers and writers of
// other tools' checkpoints.
#pragma once

#include <doctest/doctest.h>

#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "backend/common/error.hpp"
#include "tests/reference_tools.hpp"
#include "tests/temporary_directory.hpp"
#include "tests/test_files.hpp"

namespace test_support {

// The directory tests/backend/ckpt/`script` wrote its checkpoints into (the script's one
// argument), the script run once per process; nullptr when Python lacks `modules` (the test
// is skipped, python_imports saying so and naming the Debian `packages`, except under CI).
// The script failing fails the test.
inline const std::filesystem::path* python_fixtures(const std::string& script, const char* modules,
                                                    const char* packages) {
  struct Fixture {
    TemporaryDirectory directory;
    bool written = false;
  };
  static std::map<std::string, std::unique_ptr<Fixture>> fixtures;
  auto found = fixtures.find(script);
  if (found == fixtures.end()) {
    auto fixture = std::make_unique<Fixture>();
    if (python_imports(modules, packages)) {
      const auto result =
          run_command(std::string(kPython) + " " + kTestSource + "/tests/backend/ckpt/" + script +
                      " " + fixture->directory.path.string());
      REQUIRE_MESSAGE(result.exit_status == 0, result.output);
      fixture->written = true;
    }
    found = fixtures.emplace(script, std::move(fixture)).first;
  }
  return found->second->written ? &found->second->directory.path : nullptr;
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
