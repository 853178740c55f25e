// Test support for the rule every writer of whole files follows (common::output_target,
// docs/security.md "Output files"): the things in a test's directory that an output flag may
// name and that must be neither replaced nor written into, each with the words of its refusal,
// and the check that a refusal left it what it was. The character device is a /dev/full of the
// test's own (mknod 1:7 in the test's directory) when the tests run as root, as in CI, so a
// writer that still replaced a device (the bug) replaces only that copy, never /dev/full.
#pragma once

#include <doctest/doctest.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

namespace test_support {

struct HostileOutput {
  std::string path;
  std::string refusal;  // what "cannot write <flag> <path>: " is followed by
  mode_t type = 0;      // S_IFMT bits of lstat, to check that it is still what it was
};

inline mode_t entry_type(const std::string& path) {
  struct stat status {};
  return ::lstat(path.c_str(), &status) == 0 ? (status.st_mode & S_IFMT) : 0;
}

inline std::vector<HostileOutput> make_hostile_outputs(const std::filesystem::path& directory) {
  namespace fs = std::filesystem;
  const std::string base = (directory / "hostile").string();
  fs::create_directories(base);
  std::vector<HostileOutput> made;
  auto add = [&](const std::string& name, const std::string& refusal) {
    const std::string path = base + "/" + name;
    made.push_back({path, refusal, entry_type(path)});
  };
  REQUIRE(::mkfifo((base + "/fifo").c_str(), 0600) == 0);
  add("fifo", "it is a FIFO (named pipe), not a regular file");
  if (::geteuid() == 0) {
    REQUIRE(::mknod((base + "/full").c_str(), S_IFCHR | 0666, makedev(1, 7)) == 0);
    add("full", "it is a character device, not a regular file");
  }
  fs::create_directories(base + "/directory");
  add("directory", "it is a directory, not a file");
  fs::create_symlink(base + "/nothing", base + "/dangling");
  add("dangling", "it is a symbolic link to nothing (dangling)");
  fs::create_symlink(base + "/loop", base + "/loop");
  add("loop", "it is a symbolic link in a loop");
  fs::create_symlink(base + "/fifo", base + "/link-to-fifo");
  add("link-to-fifo", "it is a symbolic link to a FIFO (named pipe), not a regular file");
  return made;
}

// After a refusal: nothing was put in its place.
inline void check_unchanged(const HostileOutput& output) {
  CAPTURE(output.path);
  CHECK(entry_type(output.path) == output.type);
}

}  // namespace test_support
