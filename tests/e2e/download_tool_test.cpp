// The download and decompress executables as the data_preparation jobs run them: exit status 2
// with one line naming the URL and the HTTP status, a status line redrawn in place with
// --progress bar and plain log lines when the output is not a terminal, and decompress writing
// through a temporary name (nothing under the final name when the input is corrupt).
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "launcher/process.hpp"
#include "temporary_directory.hpp"
#include "test_files.hpp"
#include "tests/backend/fetch/http_test_server.hpp"

namespace fs = std::filesystem;
using test_support::HttpTestServer;
using test_support::TemporaryDirectory;

namespace {

using test_support::read_file;

const std::string kDownload = std::string(TEST_BIN_DIR) + "/download";
const std::string kDecompress = std::string(TEST_BIN_DIR) + "/decompress";

}  // namespace

TEST_CASE("download: a 404 exits 2 with one error line naming the URL and the status") {
  HttpTestServer server;
  TemporaryDirectory directory;
  const std::string url = server.url("/corpus/missing.jsonl.xz");
  const auto run = launcher::run_and_capture({kDownload, url, "--output", (directory.path / "x").string()});
  CHECK(run.exit_code == 2);
  CHECK(run.output.find("[download] [error] download " + url + ": HTTP 404 Not Found") != std::string::npos);
  CHECK(fs::is_empty(directory.path));
}

TEST_CASE("download: plain lines in a log, a status line redrawn in place with --progress bar") {
  HttpTestServer server;
  const std::string content(3 << 20, 'x');
  server.serve("/big.jsonl", {.content = content});
  TemporaryDirectory directory;
  // Captured through a pipe: not a terminal, so `auto` means log lines.
  const auto logged = launcher::run_and_capture({kDownload, server.url("/big.jsonl"), "--output",
                                                 (directory.path / "log.jsonl").string()});
  INFO(logged.output);
  CHECK(logged.exit_code == 0);
  CHECK(logged.output.find('\r') == std::string::npos);
  CHECK(logged.output.find("saved " + (directory.path / "log.jsonl").string() + " (3.0 MiB)") != std::string::npos);
  CHECK(read_file(directory.path / "log.jsonl") == content);

  const auto bar = launcher::run_and_capture({kDownload, server.url("/big.jsonl"), "--output",
                                              (directory.path / "bar.jsonl").string(), "--progress", "bar"});
  CHECK(bar.exit_code == 0);
  CHECK(bar.output.find("\rbar.jsonl  3.0 MiB / 3.0 MiB  100.0%") != std::string::npos);
  CHECK(bar.output.find("\x1b[K") != std::string::npos);
}

TEST_CASE("download: without --output the file is named after the URL, in the current directory") {
  TemporaryDirectory directory;
  std::ofstream(directory.path / "source.txt") << "hello";
  const auto run = launcher::run_and_capture(
      {"bash", "-c", "cd \"$1\" && \"$2\" \"file://$1/source.txt\"", "bash", directory.path.string(), kDownload});
  // In the source's own directory the output would be the source itself: it exists, so it is kept.
  CHECK(run.exit_code == 0);
  CHECK(run.output.find("is already there") != std::string::npos);
  const auto renamed = launcher::run_and_capture(
      {"bash", "-c", "mkdir -p \"$1/out\" && cd \"$1/out\" && \"$2\" \"file://$1/source.txt\"", "bash",
       directory.path.string(), kDownload});
  CHECK(renamed.exit_code == 0);
  CHECK(read_file(directory.path / "out/source.txt") == "hello");
}

TEST_CASE("decompress: .xz to the name without the suffix — a corrupt input leaves nothing behind") {
  TemporaryDirectory directory;
  const fs::path jsonl = directory.path / "shard.jsonl";
  std::string text;
  for (int i = 0; i < 2000; ++i) text += "{\"text\": \"line " + std::to_string(i) + "\"}\n";
  std::ofstream(jsonl) << text;
  REQUIRE(launcher::run_and_capture({"xz", jsonl.string()}).exit_code == 0);  // leaves shard.jsonl.xz only
  REQUIRE_FALSE(fs::exists(jsonl));
  const auto run = launcher::run_and_capture({kDecompress, jsonl.string() + ".xz"});
  INFO(run.output);
  CHECK(run.exit_code == 0);
  CHECK(read_file(jsonl) == text);
  CHECK(run.output.find("decompressing " + jsonl.string() + ".xz (xz)") != std::string::npos);

  const auto kept = launcher::run_and_capture({kDecompress, jsonl.string() + ".xz"});
  CHECK(kept.exit_code == 0);
  CHECK(kept.output.find("is already there") != std::string::npos);

  std::string corrupt = read_file(jsonl.string() + ".xz");
  corrupt.resize(corrupt.size() / 2);
  std::ofstream(directory.path / "cut.jsonl.xz", std::ios::binary) << corrupt;
  const auto failed = launcher::run_and_capture({kDecompress, (directory.path / "cut.jsonl.xz").string()});
  CHECK(failed.exit_code == 2);
  CHECK(failed.output.find("cut.jsonl.xz") != std::string::npos);
  CHECK_FALSE(fs::exists(directory.path / "cut.jsonl"));
  for (const auto& entry : fs::directory_iterator(directory.path)) {
    CHECK(entry.path().filename().string().find(".tmp-") == std::string::npos);
  }

  const auto unnamed = launcher::run_and_capture({kDecompress, jsonl.string()});
  CHECK(unnamed.exit_code == 2);
  CHECK(unnamed.output.find("does not end in .gz, .zst or .xz; pass --output FILE") != std::string::npos);

  // --remove-input (NeMo's rm_downloaded): never after a failure; once the output is in place,
  // also when it was already there.
  const auto failed_kept = launcher::run_and_capture(
      {kDecompress, (directory.path / "cut.jsonl.xz").string(), "--remove-input"});
  CHECK(failed_kept.exit_code == 2);
  CHECK(fs::exists(directory.path / "cut.jsonl.xz"));
  const auto removed = launcher::run_and_capture({kDecompress, jsonl.string() + ".xz", "--remove-input"});
  INFO(removed.output);
  CHECK(removed.exit_code == 0);
  CHECK_FALSE(fs::exists(jsonl.string() + ".xz"));
  CHECK(read_file(jsonl) == text);
  CHECK(removed.output.find("removed " + jsonl.string() + ".xz (--remove-input)") != std::string::npos);
}

TEST_CASE("decompress refuses content its name does not promise, and plain input — nothing is written") {
  TemporaryDirectory directory;
  const fs::path plain = directory.path / "shard.jsonl.gz";  // named .gz, plain inside
  std::ofstream(plain) << "{\"text\": \"not compressed\"}\n";
  const auto renamed = launcher::run_and_capture({kDecompress, plain.string()});
  INFO(renamed.output);
  CHECK(renamed.exit_code == 2);
  CHECK(renamed.output.find("named .gz, but its content is not gzip: it is plain") != std::string::npos);
  CHECK_FALSE(fs::exists(directory.path / "shard.jsonl"));
  // Plain content under any name, with --output: nothing to decompress.
  const fs::path text = directory.path / "notes.txt";
  std::ofstream(text) << "hello\n";
  const auto copied = launcher::run_and_capture({kDecompress, text.string(), "--output", (directory.path / "out").string()});
  INFO(copied.output);
  CHECK(copied.exit_code == 2);
  CHECK(copied.output.find("is not compressed (gzip, zstd or xz); nothing to decompress") != std::string::npos);
  CHECK_FALSE(fs::exists(directory.path / "out"));
  for (const auto& entry : fs::directory_iterator(directory.path)) {
    CHECK(entry.path().filename().string().find(".tmp-") == std::string::npos);
  }
}

TEST_CASE("download: a file:// directory and bad numbers exit 2 with one clear line") {
  TemporaryDirectory directory;
  const auto dir = launcher::run_and_capture(
      {kDownload, "file://" + directory.path.string() + "/", "--output", (directory.path / "x").string()});
  INFO(dir.output);
  CHECK(dir.exit_code == 2);
  CHECK(dir.output.find("is not a regular file") != std::string::npos);
  CHECK_FALSE(fs::exists(directory.path / "x"));
  const auto negative = launcher::run_and_capture({kDownload, "--retries", "-1", "file:///x"});
  INFO(negative.output);
  CHECK(negative.exit_code == 2);
  CHECK(negative.output.find("--retries: '-1' is out of range; --retries takes an integer in [0, 1000]") != std::string::npos);
}

TEST_CASE("decompress and download: an --output that is a directory exits 2, never 0 or 3") {
  TemporaryDirectory directory;
  const fs::path jsonl = directory.path / "a.jsonl";
  std::ofstream(jsonl) << "{\"text\": \"x\"}\n";
  REQUIRE(launcher::run_and_capture({"gzip", "-k", jsonl.string()}).exit_code == 0);
  fs::create_directories(directory.path / "dir");
  for (const char* force : {"", "--force"}) {
    std::vector<std::string> decompress = {kDecompress, jsonl.string() + ".gz", "--output",
                                           (directory.path / "dir").string()};
    std::vector<std::string> download = {kDownload, "file://" + jsonl.string(), "--output",
                                         (directory.path / "dir").string()};
    if (*force) {
      decompress.push_back(force);
      download.push_back(force);
    }
    for (const auto& argv : {decompress, download}) {
      const auto run = launcher::run_and_capture(argv);
      INFO(run.output);
      CHECK(run.exit_code == 2);
      CHECK(run.output.find("cannot write --output " + (directory.path / "dir").string() +
                            ": it is a directory, not a file") != std::string::npos);
    }
  }
  // A path ending in '/' names a directory too, existing or not; nothing is left there.
  for (const auto& argv : std::vector<std::vector<std::string>>{
           {kDecompress, jsonl.string() + ".gz", "--output", (directory.path / "new").string() + "/"},
           {kDownload, "file://" + jsonl.string(), "--output", (directory.path / "new").string() + "/"}}) {
    const auto run = launcher::run_and_capture(argv);
    INFO(run.output);
    CHECK(run.exit_code == 2);
    CHECK(run.output.find("names a directory, not a file to write") != std::string::npos);
    CHECK_FALSE(fs::exists(directory.path / "new"));
  }
}

TEST_CASE("download: a URL whose file name is too long exits 2 naming the problem and --output") {
  // A 100,000-character URL used to end in "internal error: filesystem error: File name too
  // long" (exit 3).
  TemporaryDirectory directory;
  const std::string url = "http://127.0.0.1:9/" + std::string(100000, 'a');
  const auto run = launcher::run_and_capture({kDownload, url});
  INFO(run.output.substr(0, 2000));
  CHECK(run.exit_code == 2);
  CHECK(run.output.find("the URL's file name is 100000 bytes, more than the 255 bytes a file name "
                        "may have; pass --output FILE") != std::string::npos);
  CHECK(run.output.find("internal error") == std::string::npos);
  CHECK(run.output.size() < 1000);  // the URL is shortened in the message
}
