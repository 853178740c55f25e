// shell_quote against a real bash: hostile strings come back out literally, and nothing in
// them is executed (a canary file that an injected command would create never appears).
#include <doctest/doctest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "launcher/process.hpp"
#include "launcher/shell_quote.hpp"

using launcher::shell_join;
using launcher::shell_quote;

TEST_CASE("plain words stay readable, everything else is single-quoted") {
  CHECK(shell_quote("--num-layers") == "--num-layers");
  CHECK(shell_quote("/a/b_c.d:e=f,g@h%i+j") == "/a/b_c.d:e=f,g@h%i+j");
  CHECK(shell_quote("") == "''");
  CHECK(shell_quote("a b") == "'a b'");
  CHECK(shell_quote("it's") == "'it'\\''s'");
  CHECK(shell_join({"echo", "a b", "c"}) == "echo 'a b' c");
}

TEST_CASE("hostile values survive a round trip through bash as literal text") {
  const auto canary = std::filesystem::temp_directory_path() / "shell_quote_canary";
  std::filesystem::remove(canary);
  const std::string touch = "touch " + canary.string();
  const std::vector<std::string> hostile = {
      "$(" + touch + ")", "`" + touch + "`", "; " + touch, "a' ; " + touch + " ; echo '",
      "\"$(" + touch + ")\"", "line1\n" + touch + "\nline3", "${HOME}", "$HOME", "*", "a\\b",
      "&& " + touch, "| " + touch, "'", "''", "\"", "!", "#comment", "~", "tab\there", "-n",
  };
  for (const auto& value : hostile) {
    CAPTURE(value);
    const auto run = launcher::run_and_capture(
        {"bash", "-c", "printf '%s' " + shell_quote(value)});
    CHECK(run.exit_code == 0);
    CHECK(run.output == value);
  }
  CHECK_FALSE(std::filesystem::exists(canary));
}
