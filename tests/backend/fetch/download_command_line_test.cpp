// download's command line (parse_download_arguments): defaults, the output named after the URL,
// and numeric flags whose text is negative, zero, huge, not finite or not a number, each
// refused with the flag and its valid range, never CLI11's "Could not convert" or "At Most 1".
#include "backend/fetch/download_command_line.hpp"

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "backend/common/error.hpp"

using namespace backend;

namespace {

std::optional<DownloadCommand> parse_download(std::vector<const char*> arguments) {
  arguments.insert(arguments.begin(), "download");
  return parse_download_arguments(static_cast<int>(arguments.size()), arguments.data());
}

}  // namespace

TEST_CASE("download's command line: values, defaults and the output named after the URL") {
  const auto command = parse_download({"https://host/data/oscar-1GB.jsonl.xz", "--retries", "0", "--retry-delay",
                              "0.5", "--max-retry-delay", "30", "--stall-timeout", "10",
                              "--connect-timeout", "5", "--sha256", "ab", "--force", "--progress", "log"});
  REQUIRE(command);
  CHECK(command->download.url == "https://host/data/oscar-1GB.jsonl.xz");
  CHECK(command->download.output == "oscar-1GB.jsonl.xz");
  CHECK(command->download.retries == 0);
  CHECK(command->download.retry_delay_seconds == 0.5);
  CHECK(command->download.max_retry_delay_seconds == 30);
  CHECK(command->download.stall_timeout_seconds == 10);
  CHECK(command->download.connect_timeout_seconds == 5);
  CHECK(command->download.force);
  CHECK(command->progress == "log");
  const auto defaults = parse_download({"--retries", "2", "file:///data/a.jsonl", "-o", "out/a.jsonl"});
  REQUIRE(defaults);
  CHECK(defaults->download.output == "out/a.jsonl");
  CHECK(defaults->download.retries == 2);
  CHECK(defaults->progress == "auto");
  CHECK_THROWS_WITH_AS(parse_download({"https://host/dir/"}), doctest::Contains("the URL names no file; pass --output FILE"),
                       common::Error);
  CHECK_THROWS_WITH_AS(parse_download({}), doctest::Contains("url is required"), common::Error);
  CHECK_THROWS_WITH_AS(parse_download({"a", "b"}), doctest::Contains("unknown argument b"), common::Error);
}

TEST_CASE("download's numeric flags: every bad text names the flag and the valid range") {
  struct Case {
    const char* flag;
    const char* value;
    const char* message;
  };
  for (const auto& [flag, value, message] : std::vector<Case>{
           {"--retries", "-1", "--retries: '-1' is out of range; --retries takes an integer in [0, 1000]"},
           {"--retries", "99999999999", "--retries: '99999999999' is out of range; --retries takes an integer in [0, 1000]"},
           {"--retries", "nan", "--retries: 'nan' is not an integer; --retries takes an integer in [0, 1000]"},
           {"--retries", "1.5", "--retries: '1.5' is not an integer; --retries takes an integer in [0, 1000]"},
           {"--retry-delay", "-1", "--retry-delay: '-1' is out of range; --retry-delay takes a real number in [0, 3600]"},
           {"--retry-delay", "nan", "--retry-delay: 'nan' is not a finite number; --retry-delay takes a real number in [0, 3600]"},
           {"--retry-delay", "inf", "--retry-delay: 'inf' is not a finite number; --retry-delay takes a real number in [0, 3600]"},
           {"--max-retry-delay", "1e999", "--max-retry-delay: '1e999' is not a finite number; --max-retry-delay takes a real number in [0, 86400]"},
           {"--stall-timeout", "0", "--stall-timeout: '0' is out of range; --stall-timeout takes an integer in [1, 86400]"},
           {"--stall-timeout", "1e9", "--stall-timeout: '1e9' is not an integer; --stall-timeout takes an integer in [1, 86400]"},
           {"--connect-timeout", "-5", "--connect-timeout: '-5' is out of range; --connect-timeout takes an integer in [1, 3600]"},
           {"--connect-timeout", "abc", "--connect-timeout: 'abc' is not an integer; --connect-timeout takes an integer in [1, 3600]"},
       }) {
    // A copy: clang 14 (the asan preset) cannot refer to a structured binding in CAPTURE's lambda.
    const auto& captured_flag = flag;
    CAPTURE(captured_flag);
    const auto& captured_value = value;
    CAPTURE(captured_value);
    CHECK_THROWS_WITH_AS(parse_download({"file:///x", flag, value}), doctest::Contains(message), common::Error);
    // The value right after the flag, the URL last: the same message (CLI11 once reported
    // "At Most 1 required but received 2" for some orders).
    CHECK_THROWS_WITH_AS(parse_download({flag, value, "file:///x"}), doctest::Contains(message), common::Error);
  }
  CHECK_THROWS_WITH_AS(parse_download({"file:///x", "--progress", "loud"}), doctest::Contains("--progress"), common::Error);
}
