// The file (or directory of files) a fuzz target writes each input to before a reader that
// takes a path opens it: one per process, under /dev/shm where there is one (the readers map or
// pread them; memory is faster than a disk for millions of small files), removed when the run
// ends.
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

// <memory or temporary directory>/<name>-<pid>
inline std::filesystem::path scratch_path(const std::string& name) {
  const std::filesystem::path directory = std::filesystem::is_directory("/dev/shm")
                                              ? "/dev/shm"
                                              : std::filesystem::temp_directory_path();
  return directory / (name + "-" + std::to_string(::getpid()));
}

// `path`'s whole content is `bytes`; a failed write ends the run (it is no finding).
inline void write_scratch(const std::filesystem::path& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) {
    std::fprintf(stderr, "fuzz target: cannot write its scratch file %s\n", path.c_str());
    std::exit(1);
  }
}

struct ScratchFile {
  std::filesystem::path path;
  explicit ScratchFile(const std::string& name) : path(scratch_path(name)) {}
  ~ScratchFile() {
    std::error_code ignored;
    std::filesystem::remove(path, ignored);
  }
  void write(std::string_view bytes) const { write_scratch(path, bytes); }
  ScratchFile(const ScratchFile&) = delete;
  ScratchFile& operator=(const ScratchFile&) = delete;
};

// For readers of several files side by side (a checkpoint's rank files) or of a file whose
// name matters (evaluate_gpt picks the detokenizer by it).
struct ScratchDirectory {
  std::filesystem::path path;
  explicit ScratchDirectory(const std::string& name) : path(scratch_path(name)) {
    std::filesystem::create_directories(path);
  }
  ~ScratchDirectory() {
    std::error_code ignored;
    std::filesystem::remove_all(path, ignored);
  }
  // path / name, whose whole content is `bytes`.
  std::filesystem::path write(const std::string& name, std::string_view bytes) const {
    write_scratch(path / name, bytes);
    return path / name;
  }
  // Every file the last input left.
  void clear() const {
    for (const auto& entry : std::filesystem::directory_iterator(path)) {
      std::filesystem::remove(entry.path());
    }
  }
  ScratchDirectory(const ScratchDirectory&) = delete;
  ScratchDirectory& operator=(const ScratchDirectory&) = delete;
};

}  // namespace fuzz_support
