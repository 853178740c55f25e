// flock-based lock files; see file_lock.hpp.
#include "backend/common/file_lock.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <sstream>
#include <utility>

#include "backend/common/error.hpp"
#include "backend/common/write_all.hpp"

namespace common {

std::string local_host_name() {
  std::array<char, 256> name{};
  if (::gethostname(name.data(), name.size() - 1) != 0) return "unknown-host";
  return name.data();
}

namespace {

LockHolder read_holder(int descriptor) {
  std::array<char, 512> text{};
  const ssize_t got = ::pread(descriptor, text.data(), text.size() - 1, 0);
  LockHolder holder;
  if (got <= 0) return holder;
  std::istringstream fields(std::string(text.data(), static_cast<size_t>(got)));
  fields >> holder.pid >> holder.host;
  return holder;
}

}  // namespace

std::optional<ExclusiveFileLock> ExclusiveFileLock::try_lock(const std::filesystem::path& path,
                                                             LockHolder& holder) {
  for (;;) {
    const int descriptor = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (descriptor < 0) {
      fail("cannot create the lock file {}: {}", path.string(), std::strerror(errno));
    }
    if (::flock(descriptor, LOCK_EX | LOCK_NB) != 0) {
      const int error = errno;
      if (error == EWOULDBLOCK) {
        holder = read_holder(descriptor);
        ::close(descriptor);
        return std::nullopt;
      }
      ::close(descriptor);
      if (error != ENOLCK && error != EINVAL && error != EOPNOTSUPP) {
        fail("cannot lock {}: {}", path.string(), std::strerror(error));
      }
      // A file system without locks (some network mounts): better to go on unguarded than
      // to refuse every run there.
      spdlog::warn("cannot lock {} ({}): this file system has no flock; nothing stops a second "
                   "process from writing here at the same time", path.string(), std::strerror(error));
      return ExclusiveFileLock(path, -1);
    }
    // The previous holder may have removed the file between our open and our flock: then we
    // hold a lock on an orphaned inode, and must lock the file the path names now.
    struct stat locked {}, named {};
    if (::fstat(descriptor, &locked) != 0 || ::stat(path.c_str(), &named) != 0 ||
        locked.st_ino != named.st_ino || locked.st_dev != named.st_dev) {
      ::close(descriptor);
      continue;
    }
    const std::string text = fmt::format("{} {}\n", ::getpid(), local_host_name());
    const int error = ::ftruncate(descriptor, 0) != 0 ? errno : write_all(descriptor, text.data(), text.size(), 0);
    if (error != 0) {
      ::close(descriptor);
      fail("cannot write the lock file {}: {}", path.string(), std::strerror(error));
    }
    return ExclusiveFileLock(path, descriptor);
  }
}

ExclusiveFileLock::ExclusiveFileLock(ExclusiveFileLock&& other) noexcept
    : path_(std::move(other.path_)), descriptor_(std::exchange(other.descriptor_, -1)) {}

ExclusiveFileLock& ExclusiveFileLock::operator=(ExclusiveFileLock&& other) noexcept {
  if (this != &other) {
    release();
    path_ = std::move(other.path_);
    descriptor_ = std::exchange(other.descriptor_, -1);
  }
  return *this;
}

ExclusiveFileLock::~ExclusiveFileLock() { release(); }

void ExclusiveFileLock::release() {
  if (descriptor_ < 0) return;
  // Unlinked while still locked, so nobody can lock this inode and believe it current.
  ::unlink(path_.c_str());
  ::close(descriptor_);
  descriptor_ = -1;
}

}  // namespace common
