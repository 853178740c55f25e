// What `launcher main` does to a run's results directory, in the order it does it:
//  1. check every path and name that becomes a directory or a file name, before anything is
//     created (an empty path, a name with '/', a name longer than a file name may be);
//  2. take the directory: an exclusive flock(2) on <dir>/.launcher.lock, which records who
//     holds it (pid, host, since when). A second launch of the same run while the first holds
//     it is refused, naming the holder, instead of both writing the same scripts;
//  3. write each file whole or not at all, as the backend writes its files
//     (common::write_text_file_atomically: a temporary with a unique name, pid and a mkstemp
//     suffix, fsync, rename(2) over the target, fsync of the directory).
// The lock is not common::ExclusiveFileLock: that one removes its file when released, this one
// stays (a later launch reads who held the run last) and can be handed to a detached job.
// flock locks belong to the open file: they go away when every process holding the descriptor
// has exited, so a crashed launcher never leaves a stale lock (NFS v4 supports them too).
#pragma once

#include <cstddef>
#include <filesystem>
#include <string>
#include <string_view>

namespace launcher {

// The longest run or job name: the longest file named after a job,
// log-<job>_<array job id>_<task>.out, must stay within Linux's 255-byte file names.
inline constexpr std::size_t kMaxNameBytes = 200;

// A name that becomes part of file names (<run>_hydra.yaml, log-<job>_<id>.out): refuses an
// empty name, '/', a NUL byte, "." and "..", and names longer than kMaxNameBytes, as a
// common::Error naming `key` and what would be valid.
void check_file_name_part(std::string_view name, std::string_view key);

// A directory the launcher will create and write into: refuses an empty path, a NUL byte, a
// path component longer than 255 bytes, a path longer than 4095 bytes, and an existing
// component that is not a directory, naming `key`.
void check_directory_path(const std::filesystem::path& directory, std::string_view key);

// Creates the directory and its parents; a failure is a common::Error naming `key` (the setting
// the directory came from), the directory and why, with what to set instead.
void create_results_dir(const std::filesystem::path& directory, std::string_view key);

// The most suffixes create_unique_directory tries (wanted-1 ... wanted-N) before giving up.
inline constexpr int kMaxUniqueSuffix = 9999;

// unique_output_dir: creates `wanted`, else `wanted-1`, `wanted-2`, ..., whichever mkdir(2)
// creates first (its parents as needed), and returns it. mkdir fails with EEXIST when the name
// is taken, also by another launcher at the same moment, so no two launches ever get the same
// directory, however many start within one second of the timestamp in its name. Failures are
// a common::Error naming `key` and the directory.
std::filesystem::path create_unique_directory(const std::filesystem::path& wanted,
                                              std::string_view key);

// The exclusive hold on a results directory, released when destroyed (or when the last
// process it was handed to exits).
class ResultsDirLock {
 public:
  // Takes <directory>/.launcher.lock without waiting. When another process holds it: a
  // common::Error naming the directory, the holder (pid, host, since when) and what to do.
  explicit ResultsDirLock(const std::filesystem::path& directory);
  ~ResultsDirLock();
  ResultsDirLock(const ResultsDirLock&) = delete;
  ResultsDirLock& operator=(const ResultsDirLock&) = delete;
  ResultsDirLock(ResultsDirLock&& other) noexcept;
  ResultsDirLock& operator=(ResultsDirLock&&) = delete;

  // Processes started from now on inherit the lock (it is close-on-exec until then), so it
  // stays held while a job that outlives the launcher (a detached local job) runs; the lock
  // file then names that job as the holder.
  void share_with_children();

  static constexpr const char* kFileName = ".launcher.lock";

 private:
  void write_holder(const std::string& holder);

  std::filesystem::path path_;
  int descriptor_ = -1;
  bool writable_ = true;  // false: another user's lock file, locked but not written
};

}  // namespace launcher
