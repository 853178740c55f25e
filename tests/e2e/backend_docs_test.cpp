// docs/backend.md documents every flag pretrain_gpt accepts: the flags are read from the real
// `pretrain_gpt --help`, so a flag added without its documentation row fails here.
#include <doctest/doctest.h>

#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "launcher/process.hpp"

TEST_CASE("docs/backend.md has a row for every flag of pretrain_gpt --help") {
  const auto help = launcher::run_and_capture({std::string(TEST_BIN_DIR) + "/pretrain_gpt", "--help"});
  REQUIRE(help.exit_code == 0);
  std::set<std::string> flags;
  const std::regex flag_pattern(R"((^|\n)\s+(--[A-Za-z0-9_-]+))");
  for (auto it = std::sregex_iterator(help.output.begin(), help.output.end(), flag_pattern);
       it != std::sregex_iterator(); ++it) {
    flags.insert((*it)[2]);
  }
  REQUIRE(flags.size() > 50);  // the parse found the options, not a stray line

  std::ifstream file(std::string(TEST_SOURCE_DIR) + "/docs/backend.md");
  REQUIRE(file);
  std::stringstream docs;
  docs << file.rdbuf();
  for (const auto& flag : flags) {
    CAPTURE(flag);
    CHECK(docs.str().find("`" + flag) != std::string::npos);
  }
}
