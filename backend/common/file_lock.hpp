// An exclusive lock on a lock file, so that two processes never write the same outputs at once
// (a --save directory, a preprocess_data output prefix): flock(2) on the file, which the kernel
// releases when the holder dies however it dies, so a killed run's lock never blocks the next.
// The file holds "<pid> <host>\n" of the holder, for the message of whoever is refused.
//
// The lock file is removed when the lock is released. That is safe with flock because taking
// the lock checks, after flock succeeds, that the path still names the inode locked: one who
// locked a file just unlinked by the previous holder sees a different (or no) inode and tries
// again on the new file (the usual pattern for removable flock files).
#pragma once

#include <filesystem>
#include <optional>
#include <string>

namespace common {

struct LockHolder {
  std::string pid;   // as written in the lock file; empty when it could not be read
  std::string host;
};

class ExclusiveFileLock {
 public:
  // Takes the lock on `path` (created if needed) without waiting. nullopt when another open
  // file description holds it (another process, or another lock of this process), with the
  // holder read from the file into `holder`. Errors creating the file are common::Error.
  static std::optional<ExclusiveFileLock> try_lock(const std::filesystem::path& path,
                                                    LockHolder& holder);

  ExclusiveFileLock(ExclusiveFileLock&& other) noexcept;
  ExclusiveFileLock& operator=(ExclusiveFileLock&& other) noexcept;
  ExclusiveFileLock(const ExclusiveFileLock&) = delete;
  ExclusiveFileLock& operator=(const ExclusiveFileLock&) = delete;
  // Removes the file, then releases the lock.
  ~ExclusiveFileLock();

  const std::filesystem::path& path() const { return path_; }

 private:
  ExclusiveFileLock(std::filesystem::path path, int descriptor)
      : path_(std::move(path)), descriptor_(descriptor) {}
  void release();

  std::filesystem::path path_;
  int descriptor_ = -1;
};

// This machine's host name, as lock files record it.
std::string local_host_name();

}  // namespace common
