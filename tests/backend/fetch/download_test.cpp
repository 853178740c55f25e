// The downloader against file:// sources and against a local HTTP server that misbehaves on
// purpose (http_test_server.hpp): resume after a cut connection, retries with exponential
// backoff on 503 (and Retry-After), stalls, servers that ignore ranges or answer 416, checksum
// mismatches refused without a final file, a stale partial file from an older version, 404s
// named in the error, existing outputs kept, and a second download into the same file refused.
#include "backend/fetch/download.hpp"

#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <iterator>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "backend/common/error.hpp"
#include "backend/common/sha256.hpp"
#include "temporary_directory.hpp"
#include "test_files.hpp"
#include "tests/backend/fetch/http_test_server.hpp"

namespace fs = std::filesystem;
using test_support::HttpTestServer;
using test_support::TemporaryDirectory;

namespace {

using test_support::read_file;

std::string random_bytes(size_t size, unsigned seed) {
  std::mt19937 random(seed);
  std::string bytes(size, '\0');
  for (char& c : bytes) c = static_cast<char>(random() & 0xFF);
  return bytes;
}

// Runs a download with its notes and log lines collected.
struct Run {
  std::vector<std::string> lines;
  std::ostringstream terminal;
  backend::TransferProgress progress{backend::ProgressMode::kLog, "test", terminal,
                                     [this](const std::string& line) { lines.push_back(line); }};
  backend::DownloadResult result;

  void go(const backend::DownloadOptions& options) { result = backend::download(options, progress); }
  bool said(const std::string& fragment) const {
    for (const auto& line : lines) {
      if (line.find(fragment) != std::string::npos) return true;
    }
    return false;
  }
  std::string all() const {
    std::string text;
    for (const auto& line : lines) text += line + "\n";
    return text;
  }
};

backend::DownloadOptions fast_options(const std::string& url, const fs::path& output) {
  backend::DownloadOptions options;
  options.url = url;
  options.output = output;
  options.retry_delay_seconds = 0.05;
  options.max_retry_delay_seconds = 2;
  options.stall_timeout_seconds = 1;
  options.connect_timeout_seconds = 5;
  return options;
}

// doctest's Contains takes its own string type; this builds one from a std::string.
doctest::Contains contains(const std::string& text) { return doctest::Contains(text.c_str()); }

double seconds_between(const HttpTestServer::Request& a, const HttpTestServer::Request& b) {
  return std::chrono::duration<double>(b.arrived - a.arrived).count();
}

}  // namespace

TEST_CASE("download copies a file:// source into place and verifies its sha256") {
  TemporaryDirectory directory;
  const std::string content = random_bytes(300000, 1);
  test_support::write_file(directory.path / "source.bin", content);
  const fs::path output = directory.path / "out" / "copy.bin";
  auto options = fast_options("file://" + (directory.path / "source.bin").string(), output);
  options.sha256 = common::sha256_hex(content);
  Run run;
  run.go(options);
  CHECK(read_file(output) == content);
  CHECK(run.result.bytes == static_cast<int64_t>(content.size()));
  CHECK(run.result.sha256 == options.sha256);
  CHECK_FALSE(fs::exists(backend::partial_download_path(output)));
  CHECK(run.said("sha256 " + options.sha256 + " verified"));
}

TEST_CASE("download resumes a partial file:// download from where the .part file ends") {
  TemporaryDirectory directory;
  const std::string content = random_bytes(200000, 2);
  test_support::write_file(directory.path / "source.bin", content);
  const fs::path output = directory.path / "copy.bin";
  test_support::write_file(backend::partial_download_path(output), content.substr(0, 123456));
  auto options = fast_options("file://" + (directory.path / "source.bin").string(), output);
  options.sha256 = common::sha256_hex(content);
  Run run;
  run.go(options);
  CHECK(run.result.resumed_from == 123456);
  CHECK(run.result.attempts == 1);
  CHECK(read_file(output) == content);
  CHECK(run.said("resuming"));
}

TEST_CASE("a missing file:// source is an error naming the URL and curl's error, not retried") {
  TemporaryDirectory directory;
  const std::string url = "file://" + (directory.path / "absent.jsonl.xz").string();
  const fs::path output = directory.path / "absent.jsonl.xz.copy";
  Run run;
  CHECK_THROWS_WITH_AS(run.go(fast_options(url, output)),
                       contains("download " + url + ": curl error 37"), common::Error);
  CHECK_FALSE(fs::exists(output));
  CHECK_FALSE(fs::exists(backend::partial_download_path(output)));  // no empty .part left
}

TEST_CASE("a connection cut midway is resumed with a range request") {
  HttpTestServer server;
  const std::string content = random_bytes(500000, 3);
  server.serve("/shard.jsonl.xz", {.content = content, .cut_count = 2, .cut_after = 100000});
  TemporaryDirectory directory;
  const fs::path output = directory.path / "shard.jsonl.xz";
  auto options = fast_options(server.url("/shard.jsonl.xz"), output);
  options.sha256 = common::sha256_hex(content);
  Run run;
  run.go(options);
  INFO(run.all());
  CHECK(read_file(output) == content);
  CHECK(run.result.attempts == 3);
  const auto requests = server.requests();
  REQUIRE(requests.size() == 3);
  CHECK(requests[0].range.empty());
  CHECK(requests[1].range == "bytes=100000-");
  CHECK(requests[2].range == "bytes=200000-");
  CHECK(run.said("curl error 18"));  // CURLE_PARTIAL_FILE, named in the retry line
}

TEST_CASE("503 answers are retried with exponentially growing delays until the file comes") {
  HttpTestServer server;
  const std::string content = random_bytes(10000, 4);
  server.serve("/busy", {.content = content, .fail_count = 3, .fail_status = 503});
  TemporaryDirectory directory;
  auto options = fast_options(server.url("/busy"), directory.path / "busy.bin");
  options.retry_delay_seconds = 0.2;
  Run run;
  run.go(options);
  INFO(run.all());
  CHECK(read_file(directory.path / "busy.bin") == content);
  CHECK(run.result.attempts == 4);
  const auto requests = server.requests();
  REQUIRE(requests.size() == 4);
  // delay = 0.2 · 2^(k−1) plus at most 25 % jitter: 0.2, 0.4, 0.8 s.
  CHECK(seconds_between(requests[0], requests[1]) >= 0.2);
  CHECK(seconds_between(requests[1], requests[2]) >= 0.4);
  CHECK(seconds_between(requests[2], requests[3]) >= 0.8);
  CHECK(seconds_between(requests[0], requests[3]) < 0.2 * 1.25 + 0.4 * 1.25 + 0.8 * 1.25 + 3.0);
  CHECK(run.said("HTTP 503 Service Unavailable (try again later); retrying in 0."));
}

TEST_CASE("a server that keeps answering 503 is given up on after the retries, naming URL and status") {
  HttpTestServer server;
  server.serve("/down", {.content = "x", .fail_count = 100, .fail_status = 503});
  TemporaryDirectory directory;
  auto options = fast_options(server.url("/down"), directory.path / "down.bin");
  options.retries = 2;
  Run run;
  CHECK_THROWS_WITH_AS(run.go(options),
                       contains("download " + server.url("/down") +
                                         ": HTTP 503 Service Unavailable (try again later); gave up "
                                         "after 3 attempts without progress"),
                       common::Error);
  CHECK(server.requests().size() == 3);
  CHECK_FALSE(fs::exists(directory.path / "down.bin"));
  CHECK_FALSE(fs::exists(backend::partial_download_path(directory.path / "down.bin")));
}

TEST_CASE("Retry-After lengthens the wait before the next attempt") {
  HttpTestServer server;
  server.serve("/later", {.content = "payload", .fail_count = 1, .fail_status = 429, .retry_after_seconds = 1});
  TemporaryDirectory directory;
  Run run;
  run.go(fast_options(server.url("/later"), directory.path / "later.bin"));
  const auto requests = server.requests();
  REQUIRE(requests.size() == 2);
  CHECK(seconds_between(requests[0], requests[1]) >= 1.0);
  CHECK(read_file(directory.path / "later.bin") == "payload");
}

TEST_CASE("a 404 is an error naming the URL and the status, with no retries and no file") {
  HttpTestServer server;
  TemporaryDirectory directory;
  const std::string url = server.url("/missing.jsonl");
  Run run;
  CHECK_THROWS_WITH_AS(run.go(fast_options(url, directory.path / "missing.jsonl")),
                       contains("download " + url + ": HTTP 404 Not Found (no such file: /missing.jsonl)"),
                       common::Error);
  CHECK(server.requests().size() == 1);
  CHECK(fs::is_empty(directory.path));
}

TEST_CASE("a checksum mismatch is refused: the final name is never written and the .part is removed") {
  HttpTestServer server;
  const std::string content = random_bytes(50000, 5);
  server.serve("/file", {.content = content});
  TemporaryDirectory directory;
  const fs::path output = directory.path / "file.bin";
  auto options = fast_options(server.url("/file"), output);
  options.sha256 = common::sha256_hex("something else");
  Run run;
  CHECK_THROWS_WITH_AS(run.go(options),
                       contains("sha256 of the downloaded file is " + common::sha256_hex(content) +
                                         ", expected " + options.sha256),
                       common::Error);
  CHECK_FALSE(fs::exists(output));
  CHECK_FALSE(fs::exists(backend::partial_download_path(output)));
  CHECK(server.requests().size() == 1);  // a fresh download that mismatches is not repeated
}

TEST_CASE("a stale .part (an older version of the file) fails verification and is downloaded again") {
  HttpTestServer server;
  const std::string content = random_bytes(60000, 6);
  server.serve("/file", {.content = content});
  TemporaryDirectory directory;
  const fs::path output = directory.path / "file.bin";
  test_support::write_file(backend::partial_download_path(output), random_bytes(20000, 99));
  auto options = fast_options(server.url("/file"), output);
  options.sha256 = common::sha256_hex(content);
  Run run;
  run.go(options);
  INFO(run.all());
  CHECK(read_file(output) == content);
  const auto requests = server.requests();
  REQUIRE(requests.size() == 2);
  CHECK(requests[0].range == "bytes=20000-");
  CHECK(requests[1].range.empty());
  CHECK(run.said("downloading it again from the start"));
}

TEST_CASE("a server that ignores the range request makes the download start over, not append") {
  HttpTestServer server;
  const std::string content = random_bytes(40000, 7);
  server.serve("/norange", {.content = content, .ignore_range = true});
  TemporaryDirectory directory;
  const fs::path output = directory.path / "norange.bin";
  test_support::write_file(backend::partial_download_path(output), content.substr(0, 15000));
  Run run;
  run.go(fast_options(server.url("/norange"), output));
  CHECK(read_file(output) == content);
  CHECK(run.said("ignored the range request"));
}

TEST_CASE("a .part that already holds the whole file is completed from the 416 answer") {
  HttpTestServer server;
  const std::string content = random_bytes(30000, 8);
  server.serve("/done", {.content = content});
  TemporaryDirectory directory;
  const fs::path output = directory.path / "done.bin";
  test_support::write_file(backend::partial_download_path(output), content);
  auto options = fast_options(server.url("/done"), output);
  options.sha256 = common::sha256_hex(content);
  Run run;
  run.go(options);
  CHECK(read_file(output) == content);
  CHECK(server.requests().size() == 1);
  CHECK(server.requests()[0].range == "bytes=30000-");
}

TEST_CASE("a stalled transfer is abandoned after the stall timeout and resumed") {
  HttpTestServer server;
  const std::string content = random_bytes(80000, 9);
  // The server would stall for 30 s. libcurl judges the speed over its last 5 seconds or so,
  // so the burst before the stall keeps the speed up that long: the transfer is abandoned
  // after about 6-7 s here (7.2 s measured), which is well short of the stall's end; the bound
  // leaves room for a sanitized build on a loaded machine (8.07 s seen against the old 8 s
  // bound, which the old 10 s stall allowed).
  server.serve("/slow", {.content = content, .stall_count = 1, .stall_after = 30000, .stall_seconds = 30});
  TemporaryDirectory directory;
  auto options = fast_options(server.url("/slow"), directory.path / "slow.bin");
  options.stall_timeout_seconds = 1;
  Run run;
  const auto began = std::chrono::steady_clock::now();
  run.go(options);
  INFO(run.all());
  CHECK(std::chrono::steady_clock::now() - began < std::chrono::seconds(20));
  CHECK(read_file(directory.path / "slow.bin") == content);
  const auto requests = server.requests();
  REQUIRE(requests.size() == 2);
  CHECK(requests[1].range == "bytes=30000-");
  CHECK(run.said("curl error 28"));  // CURLE_OPERATION_TIMEDOUT
}

TEST_CASE("an existing output is kept — with a sha256 it is verified first") {
  HttpTestServer server;
  server.serve("/file", {.content = "new content"});
  TemporaryDirectory directory;
  const fs::path output = directory.path / "file.txt";
  test_support::write_file(output, "old content");
  Run kept;
  kept.go(fast_options(server.url("/file"), output));
  CHECK(kept.result.already_there);
  CHECK(read_file(output) == "old content");
  CHECK(server.requests().empty());

  auto verified = fast_options(server.url("/file"), output);
  verified.sha256 = common::sha256_hex("new content");
  Run mismatch;
  CHECK_THROWS_WITH_AS(mismatch.go(verified), doctest::Contains("already exists, but its sha256 is"),
                       common::Error);
  CHECK(read_file(output) == "old content");

  verified.force = true;
  Run forced;
  forced.go(verified);
  CHECK(read_file(output) == "new content");
}

TEST_CASE("a second download into the same file while one runs is refused") {
  TemporaryDirectory directory;
  test_support::write_file(directory.path / "source", "data");
  const fs::path output = directory.path / "copy";
  const int fd = ::open(backend::partial_download_path(output).c_str(), O_RDWR | O_CREAT, 0644);
  REQUIRE(fd >= 0);
  REQUIRE(::flock(fd, LOCK_EX) == 0);
  Run run;
  CHECK_THROWS_WITH_AS(run.go(fast_options("file://" + (directory.path / "source").string(), output)),
                       contains("another download into " + output.string() + " is running"),
                       common::Error);
  ::close(fd);
  Run again;
  again.go(fast_options("file://" + (directory.path / "source").string(), output));
  CHECK(read_file(output) == "data");
}

TEST_CASE("bad options are refused with the option named") {
  TemporaryDirectory directory;
  auto options = fast_options("file:///nonexistent", directory.path / "x");
  options.sha256 = "abc";
  Run run;
  CHECK_THROWS_WITH_AS(run.go(options), doctest::Contains("--sha256 'abc' is not a SHA-256 digest"),
                       common::Error);
  options.sha256.clear();
  options.retries = -1;
  CHECK_THROWS_WITH_AS(run.go(options), doctest::Contains("--retries must be at least 0"), common::Error);
  auto unsupported = fast_options("gopher://example.org/x", directory.path / "y");
  CHECK_THROWS_WITH_AS(run.go(unsupported), doctest::Contains("curl error 1 (Unsupported protocol)"),
                       common::Error);
}

TEST_CASE("a file:// URL naming a directory or a device is refused, with no output written") {
  // It used to "download" a directory as an empty file.
  TemporaryDirectory directory;
  fs::create_directories(directory.path / "dir");
  for (const std::string& url : {"file://" + (directory.path / "dir").string() + "/",
                                "file://" + (directory.path / "dir").string(), std::string("file:///dev/null")}) {
    CAPTURE(url);
    Run run;
    CHECK_THROWS_WITH_AS(run.go(fast_options(url, directory.path / "out")),
                         doctest::Contains("is not a regular file"), common::Error);
    CHECK_FALSE(fs::exists(directory.path / "out"));
    CHECK_FALSE(fs::exists(directory.path / "out.part"));
  }
}

TEST_CASE("a file:// copy keeps the source's permission bits and a .part is its owner's only") {
  // `download file:///etc/shadow` used to save a 0644 copy of a 0640 file.
  TemporaryDirectory directory;
  struct Umask {  // 022 for the test, the process's own again after it, however it ends
    mode_t old = ::umask(022);
    ~Umask() { ::umask(old); }
  } umask_022;
  for (const mode_t mode : {0640, 0600, 0755, 0444}) {
    CAPTURE(mode);
    const fs::path source = directory.path / ("source" + std::to_string(mode));
    test_support::write_file(source, "secret");
    REQUIRE(::chmod(source.c_str(), mode) == 0);
    const fs::path output = directory.path / ("copy" + std::to_string(mode));
    Run run;
    run.go(fast_options("file://" + source.string(), output));
    struct stat status {};
    REQUIRE(::stat(output.c_str(), &status) == 0);
    CHECK((status.st_mode & 07777) == mode);
  }
  // A download cut short leaves its .part readable by its owner only; once complete, an
  // http(s) download is 0666 less the umask, as curl -o makes it.
  HttpTestServer server;
  server.serve("/private.bin", {.content = random_bytes(50000, 9), .cut_count = 1, .cut_after = 1000});
  const fs::path output = directory.path / "private.bin";
  auto options = fast_options(server.url("/private.bin"), output);
  options.retries = 0;
  Run cut;
  CHECK_THROWS_AS(cut.go(options), common::Error);
  struct stat part {};
  REQUIRE(::stat(backend::partial_download_path(output).c_str(), &part) == 0);
  CHECK(part.st_size == 1000);
  CHECK((part.st_mode & 07777) == 0600);
  options.retries = 3;
  Run resumed;
  resumed.go(options);
  struct stat done {};
  REQUIRE(::stat(output.c_str(), &done) == 0);
  CHECK((done.st_mode & 07777) == 0644);
}

TEST_CASE("names up to 255 bytes are downloaded and their .part name fits in 255 bytes too") {
  // A 255-byte name used to fail: "<name>.part" is 260 bytes.
  TemporaryDirectory directory;
  test_support::write_file(directory.path / "source", "data");
  const std::string url = "file://" + (directory.path / "source").string();
  const fs::path output = directory.path / std::string(255, 'n');
  const fs::path part = backend::partial_download_path(output);
  CHECK(part.parent_path() == output.parent_path());
  CHECK(part.filename().string().size() == 255);
  CHECK(part.filename().string().ends_with(".part"));
  // Two long names with one beginning have two .part files.
  CHECK(backend::partial_download_path(directory.path / (std::string(254, 'n') + "x")) != part);
  CHECK(backend::partial_download_path(directory.path / "short") == directory.path / "short.part");
  Run run;
  run.go(fast_options(url, output));
  CHECK(read_file(output) == "data");
  CHECK_FALSE(fs::exists(part));
  Run too_long;
  CHECK_THROWS_WITH_AS(too_long.go(fast_options(url, directory.path / std::string(256, 'n'))),
                       doctest::Contains("the file name is 256 bytes, more than the 255 bytes a "
                                         "file name may have; give --output a shorter name"),
                       common::Error);
}

TEST_CASE("an --output that is a directory is refused, not taken for a finished download") {
  // "already there" used to ask the directory's file size: an internal error (exit 3).
  TemporaryDirectory directory;
  test_support::write_file(directory.path / "source", "data");
  fs::create_directories(directory.path / "dir");
  for (const bool force : {false, true}) {
    auto options = fast_options("file://" + (directory.path / "source").string(), directory.path / "dir");
    options.force = force;
    Run run;
    CHECK_THROWS_WITH_AS(run.go(options),
                         contains("cannot write --output " + (directory.path / "dir").string() +
                                  ": it is a directory, not a file"),
                         common::Error);
    CHECK_FALSE(fs::exists(directory.path / "dir.part"));
  }
}
