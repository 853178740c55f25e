// Opening user-named files (common/user_file): an open file and a mapping hold exactly the
// file; a missing file, a directory, a device or a FIFO (without waiting on it) is refused
// with the role, the path, the reason and the hint; and neither leaks when it is refused or
// moved: a process that refuses thousands of files keeps its descriptor count and its
// address space.
#include "backend/common/user_file.hpp"

#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <utility>

#include "backend/common/error.hpp"
#include "temporary_directory.hpp"

namespace fs = std::filesystem;

namespace {

using test_support::TemporaryDirectory;

// Descriptors open in this process now.
int open_descriptors() {
  int count = 0;
  for ([[maybe_unused]] const auto& entry : fs::directory_iterator("/proc/self/fd")) ++count;
  return count;
}

std::string text_of(std::span<const std::byte> bytes) {
  return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
}

}  // namespace

TEST_CASE("an open file and a mapped file hold the file, bytes as they are") {
  TemporaryDirectory temporary;
  const fs::path file = temporary.path / "corpus.bin";
  const std::string contents("tokens\0\xff", 8);
  std::ofstream(file, std::ios::binary) << contents;
  const common::OpenFile open(file, "dataset file");
  CHECK(open.size() == contents.size());
  char first = 0;
  CHECK(::pread(open.descriptor(), &first, 1, 0) == 1);
  CHECK(first == 't');
  common::MappedFile mapped(file, "dataset file");
  CHECK(text_of(mapped.bytes()) == contents);
  // Moved, the mapping goes with the object; the source holds nothing.
  common::MappedFile moved(std::move(mapped));
  CHECK(text_of(moved.bytes()) == contents);
  CHECK(mapped.bytes().empty());  // NOLINT(bugprone-use-after-move): the moved-from state
  const fs::path empty = temporary.path / "empty.bin";
  std::ofstream{empty};
  CHECK(common::MappedFile(empty, "dataset file").bytes().empty());
}

TEST_CASE("what is not a regular file is refused with its role, path, reason and hint") {
  TemporaryDirectory temporary;
  const fs::path missing = temporary.path / "missing.idx";
  CHECK_THROWS_WITH_AS(common::MappedFile(missing, "dataset file", " (build it first)"),
                       ("cannot read dataset file " + missing.string() +
                        ": No such file or directory (build it first)")
                           .c_str(),
                       common::Error);
  CHECK_THROWS_WITH_AS(
      common::OpenFile(temporary.path, "checkpoint"),
      ("cannot read checkpoint " + temporary.path.string() + ": it is a directory, not a file")
          .c_str(),
      common::Error);
  CHECK_THROWS_WITH_AS(common::MappedFile("/dev/zero", ".npy file"),
                       "cannot read .npy file /dev/zero: it is a character device, not a "
                       "regular file",
                       common::Error);
  // A FIFO with no writer: opening it to read would wait forever.
  const fs::path fifo = temporary.path / "fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  CHECK_THROWS_WITH_AS(common::MappedFile(fifo, "dataset file"),
                       doctest::Contains(": it is a FIFO (named pipe), not a regular file"),
                       common::Error);
}

TEST_CASE("refused, mapped and moved files give their descriptors back") {
  TemporaryDirectory temporary;
  const fs::path file = temporary.path / "data.npy";
  std::ofstream(file) << "content";
  const fs::path fifo = temporary.path / "fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  const int before = open_descriptors();
  for (int i = 0; i < 100; ++i) {
    CHECK_THROWS_AS(common::OpenFile(fifo, "a FIFO"), common::Error);
    CHECK_THROWS_AS(common::MappedFile(temporary.path, "a directory"), common::Error);
    const common::MappedFile mapped(file, "a file");  // closed once mapped
    common::OpenFile open(file, "a file");
    common::OpenFile other(file, "a file");
    other = std::move(open);  // `other`'s own descriptor is closed here
  }
  CHECK(open_descriptors() == before);
}
