// Test support: the job templates and the golden job scripts the cluster tests render against.
// UPDATE_GOLDEN=1 rewrites a golden file from what was rendered (then review the diff).
#pragma once

#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "test_files.hpp"

namespace test_support {

inline const std::filesystem::path kTemplates = kSourceDir / "templates";
inline const std::filesystem::path kGolden = kSourceDir / "tests/launcher/clusters/golden";

inline void check_golden(const std::string& rendered, const std::string& name) {
  const std::filesystem::path path = kGolden / name;
  if (const char* update = std::getenv("UPDATE_GOLDEN"); update && std::string(update) == "1") {
    std::ofstream(path) << rendered;
  }
  REQUIRE_MESSAGE(std::filesystem::exists(path), "missing golden file " << path << " (UPDATE_GOLDEN=1)");
  CHECK(rendered == read_file(path));
}

}  // namespace test_support
