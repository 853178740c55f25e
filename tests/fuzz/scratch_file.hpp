// The file a fuzz target writes each input to before a reader that takes a path opens it: one
// per process, under /dev/shm where there is one (the readers map or pread it; memory is
// faster than a disk for millions of small files), removed when the run ends.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <system_error>

namespace fuzz_support {

struct ScratchFile {
  std::filesystem::path path;
  explicit ScratchFile(const std::string& name) {
    const std::filesystem::path directory = std::filesystem::is_directory("/dev/shm")
                                                ? "/dev/shm"
                                                : std::filesystem::temp_directory_path();
    path = directory / (name + "-" + std::to_string(::getpid()));
  }
  ~ScratchFile() {
    std::error_code ignored;
    std::filesystem::remove(path, ignored);
  }
  // The file's whole content is `bytes`; a failed write ends the run (it is no finding).
  void write(std::string_view bytes) const {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.close();
    if (!out) {
      std::fprintf(stderr, "fuzz target: cannot write its scratch file %s\n", path.c_str());
      std::exit(1);
    }
  }
  ScratchFile(const ScratchFile&) = delete;
  ScratchFile& operator=(const ScratchFile&) = delete;
};

}  // namespace fuzz_support
