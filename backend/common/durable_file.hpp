// The POSIX durability steps that make every file we write appear whole or not at all:
// checkpoints (docs/checkpoints.md, "Crash safety"), dataset pairs and index caches, and the
// launcher's job scripts and configs. A write is only on disk after fsync of the file, and a rename (or a new
// directory entry) only after fsync of the directory holding it; rename(2) within one file
// system is atomic, so a reader sees the old name's target or the new one, never a mix.
// These are the steps of the classic "write temporary, fsync, rename, fsync directory"
// protocol (see e.g. the ext4 and POSIX rename(2) documentation).
#pragma once

#include <cstddef>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>

namespace common {

// A new file written front to back: created exclusively (an existing file is an error),
// finished with fsync. Destroying an unfinished writer closes the file without fsync (the
// caller abandons a temporary file that a later save removes).
class DurableFileWriter {
 public:
  explicit DurableFileWriter(std::filesystem::path path);
  // A new file beside `target`, to be renamed over it when finished:
  // `<target>.tmp-<pid>-XXXXXX`, the suffix chosen by mkstemp(3), so two writers of one target
  // never share a temporary, not even two threads of one process (same pid). A target name
  // too long to take the suffix within a file name's 255 bytes lends only its first bytes.
  static DurableFileWriter temporary_for(const std::filesystem::path& target);
  ~DurableFileWriter();
  DurableFileWriter(const DurableFileWriter&) = delete;
  DurableFileWriter& operator=(const DurableFileWriter&) = delete;

  void write(std::span<const std::byte> bytes);
  void write_zeros(size_t count);
  // Adds execute permission for the owner and the group (a job script).
  void make_executable();
  uint64_t bytes_written() const { return bytes_written_; }
  const std::filesystem::path& path() const { return path_; }
  // fsync, then close. Errors name the file.
  void finish();

 private:
  DurableFileWriter(std::filesystem::path path, int descriptor)
      : path_(std::move(path)), descriptor_(descriptor) {}

  std::filesystem::path path_;
  int descriptor_ = -1;
  uint64_t bytes_written_ = 0;
};

// fsync of a directory, so the entries created, renamed or removed in it are durable.
void fsync_directory(const std::filesystem::path& directory);

// rename(2) that names both paths in its error.
void rename_path(const std::filesystem::path& from, const std::filesystem::path& to);

enum class FileMode { regular, executable };

// Replaces `target` by `text` atomically and durably: writes a temporary_for(target), fsyncs
// it, renames it over `target`, fsyncs the directory. A crash leaves the old or the new file
// (and possibly the temporary); concurrent writers of one target each rename a whole file.
// Errors ("cannot write <target>: ...") remove the temporary.
void write_text_file_atomically(const std::filesystem::path& target, std::string_view text,
                                FileMode mode = FileMode::regular);

// A test hook for the crash-safety tests (tests/e2e/*_kill_test.cpp): when the environment
// variable MEGATRON_NATIVE_CRASH_AT equals `point`, the process kills itself with SIGKILL
// here, as a node failure or the kernel's OOM killer would stop it: no destructor runs and
// nothing is flushed. Unset (always, outside those tests), it does nothing.
void crash_point(std::string_view point);

}  // namespace common
