// Bounded whole-file reads (common/small_file): a regular file within the limit is read whole;
// a directory, FIFO, device or a file over the limit (a sparse 100 GB file, a /proc file that
// says size 0) is refused by name before or while reading, never read without bound or waited
// on.
#include "backend/common/small_file.hpp"

#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "backend/common/error.hpp"
#include "temporary_directory.hpp"

namespace fs = std::filesystem;

TEST_CASE("a regular file within the limit is read whole, bytes as they are") {
  test_support::TemporaryDirectory temporary;
  const fs::path file = temporary.path / "vocab.json";
  const std::string contents("{\"a\": 1}\n\0\xff tail", 16);
  std::ofstream(file, std::ios::binary) << contents;
  CHECK(common::read_small_file(file, "--vocab-file") == contents);
  CHECK(common::read_small_file(file, "--vocab-file", contents.size()) == contents);
  const fs::path empty = temporary.path / "empty.txt";
  std::ofstream{empty};
  CHECK(common::read_small_file(empty, "--data-args-path").empty());
}

TEST_CASE("a file over the limit is refused naming the role, the path, its size and the limit") {
  test_support::TemporaryDirectory temporary;
  const fs::path file = temporary.path / "merges.txt";
  std::ofstream(file) << "0123456789";
  CHECK_THROWS_WITH_AS(common::read_small_file(file, "--merge-file", 9),
                       ("cannot read --merge-file " + file.string() +
                        ": it is 10 bytes, more than the 9 bytes a file read whole may have").c_str(),
                       common::Error);
  // A sparse 100 GB file: refused from its size, before any of it is read.
  const fs::path sparse = temporary.path / "sparse.json";
  std::ofstream{sparse};
  REQUIRE(::truncate(sparse.c_str(), 100LL << 30) == 0);
  CHECK_THROWS_WITH_AS(common::read_small_file(sparse, "--vocab-file"),
                       doctest::Contains("it is 107374182400 bytes, more than the 268435456 bytes "
                                         "(256 MiB) a file read whole may have"),
                       common::Error);
  // /proc files say size 0 and hold more: read on, and refused once past the limit.
  CHECK(common::read_small_file("/proc/self/status", "a /proc file").find("Name:") == 0);
  CHECK_THROWS_WITH_AS(common::read_small_file("/proc/self/status", "a /proc file", 16),
                       doctest::Contains("bytes, more than the 16 bytes"), common::Error);
}

TEST_CASE("what is not a regular file is refused without reading or waiting on it") {
  test_support::TemporaryDirectory temporary;
  const std::string missing = (temporary.path / "missing.json").string();
  CHECK_THROWS_WITH_AS(common::read_small_file(missing, "--vocab-file"),
                       ("cannot read --vocab-file " + missing + ": No such file or directory").c_str(),
                       common::Error);
  CHECK_THROWS_WITH_AS(common::read_small_file(temporary.path, "--vocab-file"),
                       doctest::Contains(": it is a directory, not a file"), common::Error);
  CHECK_THROWS_WITH_AS(common::read_small_file("/dev/zero", "--vocab-file"),
                       "cannot read --vocab-file /dev/zero: it is a character device, not a "
                       "regular file",
                       common::Error);
  // A FIFO with no writer: opening it to read would wait forever.
  const fs::path fifo = temporary.path / "fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  CHECK_THROWS_WITH_AS(common::read_small_file(fifo, "--merge-file"),
                       doctest::Contains(": it is a FIFO (named pipe), not a regular file"),
                       common::Error);
}

TEST_CASE("read_small_file_if_exists: nothing there is nullopt, anything there is read or refused") {
  test_support::TemporaryDirectory temporary;
  const fs::path file = temporary.path / "tracker.txt";
  CHECK_FALSE(common::read_small_file_if_exists(file, "the tracker").has_value());
  // A parent that is a file, and a name longer than a file name may be: nothing can be there.
  std::ofstream(file) << "12\n";
  CHECK_FALSE(common::read_small_file_if_exists(file / "below", "the tracker").has_value());
  CHECK_FALSE(common::read_small_file_if_exists(temporary.path / std::string(300, 'a'),
                                                "the job's exit status")
                  .has_value());
  CHECK(common::read_small_file_if_exists(file, "the tracker") == std::optional<std::string>("12\n"));
  const fs::path fifo = temporary.path / "fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  CHECK_THROWS_WITH_AS(common::read_small_file_if_exists(fifo, "the tracker"),
                       doctest::Contains("it is a FIFO"), common::Error);
  // A dangling link is something there that cannot be read.
  fs::create_symlink(temporary.path / "gone", temporary.path / "dangling");
  CHECK_THROWS_WITH_AS(common::read_small_file_if_exists(temporary.path / "dangling", "the tracker"),
                       doctest::Contains("No such file or directory"), common::Error);
}
