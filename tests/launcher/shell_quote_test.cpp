// shell_quote against a real bash: hostile strings come back out literally, and nothing in
// them is executed (a canary file that an injected command would create never appears).
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <filesystem>
#include <string>
#include <vector>

#include "backend/common/error.hpp"
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

TEST_CASE("a quoted word is always one line: no raw control character, whatever the input") {
  CHECK(shell_quote("a\nb") == "$'a\\nb'");
  CHECK(shell_quote("tab\there") == "$'tab\\there'");
  CHECK(shell_quote("it's\n") == "$'it\\'s\\n'");
  CHECK(shell_quote("back\\slash\r") == "$'back\\\\slash\\r'");
  CHECK(shell_quote(std::string("\x01" "a\x7f", 3)) == "$'\\x01a\\x7f'");
  // A NUL byte cannot be part of any shell word (bash would cut the word there).
  CHECK_THROWS_WITH_AS(shell_quote(std::string("a\0b", 3)), doctest::Contains("NUL"), common::Error);

  // Every byte but NUL, alone and between letters: the quoted form holds no byte below 0x20
  // and no DEL, and bash reads it back as exactly the original word.
  std::vector<std::string> words;
  for (int byte = 1; byte <= 0xff; ++byte) {
    words.push_back(std::string(1, static_cast<char>(byte)));
    std::string between = "a";
    between += static_cast<char>(byte);
    between += 'b';
    words.push_back(between);
  }
  words.push_back("\n\n'\\''\x1b[31m$(x)\\x41\\n");
  std::string script;
  for (const auto& word : words) {
    const std::string quoted = shell_quote(word);
    CAPTURE(word);
    for (char c : quoted) {
      const auto byte = static_cast<unsigned char>(c);
      REQUIRE_MESSAGE((byte >= 0x20 && byte != 0x7f), "raw control byte in " << quoted);
    }
    script += "printf '%s\\0' " + quoted + "\n";
  }
  const auto run = launcher::run_and_capture({"bash", "-c", script});
  REQUIRE(run.exit_code == 0);
  std::vector<std::string> printed;
  for (size_t start = 0; start < run.output.size();) {
    const size_t end = run.output.find('\0', start);
    REQUIRE(end != std::string::npos);
    printed.push_back(run.output.substr(start, end - start));
    start = end + 1;
  }
  REQUIRE(printed.size() == words.size());
  for (size_t i = 0; i < words.size(); ++i) {
    CAPTURE(i);
    CHECK(printed[i] == words[i]);
  }
}

TEST_CASE("a quoted word in a comment line stays in the comment") {
  const auto canary = std::filesystem::temp_directory_path() / "shell_quote_comment_canary";
  std::filesystem::remove(canary);
  const std::string touch = "touch " + canary.string();
  std::string script;
  for (const char* shape : {"x\n{}\n", "x\r\n{}", "x\n#\n{} #", "a\x0b{}", "'\n{}\n'"}) {
    const std::string value = fmt::format(fmt::runtime(shape), touch);
    script += "# run " + shell_quote(value) + " on the local cluster\n";
  }
  script += "echo done\n";
  const auto run = launcher::run_and_capture({"bash", "-c", script});
  CHECK(run.exit_code == 0);
  CHECK(run.output == "done\n");
  CHECK_FALSE(std::filesystem::exists(canary));
}

TEST_CASE("shell identifiers: what an export may name") {
  for (const char* name : {"A", "_", "NCCL_DEBUG", "omp_num_threads2", "_x9"}) {
    CAPTURE(name);
    CHECK(launcher::is_shell_identifier(name));
  }
  for (const char* name : {"", "9A", "A-B", "A B", "A=B", "$(x)", "A;B", "é"}) {
    CAPTURE(name);
    CHECK_FALSE(launcher::is_shell_identifier(name));
  }
}
