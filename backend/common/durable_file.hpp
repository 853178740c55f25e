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
  // A new file beside `target` (a file replaceable_output_file returned), to be renamed over
  // it when finished:
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

// The one rule for a path a writer of whole files is given, applied before anything is written
// (docs/security.md, "Output files"). What is at the path now decides:
//   nothing, or a regular file   the file is created or replaced (`file` is the path);
//   a symbolic link whose final  that file is replaced, in its own directory (`file` is the
//   target is a regular file     target); the link stays a link, as `cp` and `>` leave it;
//   this process's standard      written through, without a rename (`standard_stream` is 1 or
//   output or error              2): /dev/stdout, /dev/stderr, /proc/self/fd/1, or any name of
//                                the same file (same st_dev and st_ino as descriptor 1 or 2);
//   anything else                refused: a directory, FIFO, socket, character or block device
//                                (/dev/full, /dev/null, /dev/sda), a dangling or looping link.
// Replacing a device's directory entry (as root) or writing into a device is never what a
// flag that names an output file means. Refusals are common::Error
//   "cannot write <what> <path>: it is a character device, not a regular file; ..."
// where `what` names the file's role (a flag: "--html"; may be empty).
struct OutputTarget {
  std::filesystem::path file;  // the regular file to create or replace
  int standard_stream = -1;    // 1 or 2: written through instead
};
OutputTarget output_target(const std::filesystem::path& path, std::string_view what);

// The same rule for writers that build a file in pieces under a temporary name and rename it
// into place (downloads, datasets, safetensors, .npy caches): they need a file to rename, so
// a standard stream is refused too. Returns the file to replace.
std::filesystem::path replaceable_output_file(const std::filesystem::path& path,
                                              std::string_view what);

// fsync of a directory, so the entries created, renamed or removed in it are durable.
void fsync_directory(const std::filesystem::path& directory);

// rename(2) that names both paths in its error.
void rename_path(const std::filesystem::path& from, const std::filesystem::path& to);

enum class FileMode { regular, executable };

// Replaces `target` by `text` atomically and durably: writes a temporary_for(target), fsyncs
// it, renames it over `target`, fsyncs the directory. A crash leaves the old or the new file
// (and possibly the temporary); concurrent writers of one target each rename a whole file.
// Errors ("cannot write <target>: ...") remove the temporary. `target` goes through
// output_target first (`what` names it in a refusal): a symbolic link has its target file
// replaced, this process's standard output or error is written through, a device, FIFO or
// directory is refused.
void write_text_file_atomically(const std::filesystem::path& target, std::string_view text,
                                FileMode mode = FileMode::regular, std::string_view what = {});

// A test hook for the crash-safety tests (tests/e2e/*_kill_test.cpp): when the environment
// variable MEGATRON_NATIVE_CRASH_AT equals `point`, the process kills itself with SIGKILL
// here, as a node failure or the kernel's OOM killer would stop it: no destructor runs and
// nothing is flushed. Unset (always, outside those tests), it does nothing.
void crash_point(std::string_view point);

}  // namespace common
