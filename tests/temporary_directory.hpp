// Test support shared by the suites: a directory under $TMPDIR made for one test and removed
// with everything in it when the test ends, however it ends.
#pragma once

#include <doctest/doctest.h>
#include <linux/magic.h>
#include <stdlib.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <filesystem>
#include <string>

namespace test_support {

struct TemporaryDirectory {
  std::filesystem::path path;
  explicit TemporaryDirectory(const std::string& prefix = "megatron_native_test",
                              const std::filesystem::path& parent =
                                  std::filesystem::temp_directory_path()) {
    std::string pattern = (parent / (prefix + "_XXXXXX")).string();
    REQUIRE(mkdtemp(pattern.data()) != nullptr);
    path = pattern;
  }
  ~TemporaryDirectory() {
    std::error_code ignored;
    std::filesystem::remove_all(path, ignored);
  }
  TemporaryDirectory(const TemporaryDirectory&) = delete;
  TemporaryDirectory& operator=(const TemporaryDirectory&) = delete;
};

// Where a test that writes thousands of small run directories puts them: /dev/shm when it is a
// tmpfs with at least `needed_bytes` free, else $TMPDIR. The launcher writes every file durably
// (fsync, then rename); on a disk each fsync waits for the device, which made a third of the
// hostile-value sweeps' time, while on tmpfs it returns at once. What such a test checks is
// what the files say, never that they survive a power cut.
inline std::filesystem::path memory_backed_temp_directory(unsigned long long needed_bytes = 256ull << 20) {
  struct statfs file_system {};
  if (statfs("/dev/shm", &file_system) == 0 && file_system.f_type == TMPFS_MAGIC &&
      static_cast<unsigned long long>(file_system.f_bavail) * file_system.f_bsize >= needed_bytes &&
      access("/dev/shm", W_OK) == 0) {
    return "/dev/shm";
  }
  return std::filesystem::temp_directory_path();
}

}  // namespace test_support
