// Opening user-named files for reading; see user_file.hpp.
#include "backend/common/user_file.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

#include "backend/common/error.hpp"

namespace common {

const char* describe_non_regular(mode_t mode) {
  if (S_ISREG(mode)) return nullptr;
  if (S_ISDIR(mode)) return "a directory, not a file";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe), not a regular file";
  if (S_ISCHR(mode)) return "a character device, not a regular file";
  if (S_ISBLK(mode)) return "a block device, not a regular file";
  if (S_ISSOCK(mode)) return "a socket, not a regular file";
  return "not a regular file";
}

OpenFile::OpenFile(const std::filesystem::path& path, std::string_view what,
                   std::string_view hint) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer; it is refused
  // below once open. A regular file ignores the flag.
  descriptor_ = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (descriptor_ < 0) {
    fail("cannot read {} {}: {}{}", what, path.string(), std::strerror(errno), hint);
  }
  struct stat status {};
  std::string refusal;
  if (::fstat(descriptor_, &status) != 0) {
    refusal = std::strerror(errno);
  } else if (const char* kind = describe_non_regular(status.st_mode)) {
    refusal = std::string("it is ") + kind;
  }
  if (!refusal.empty()) {
    ::close(descriptor_);
    fail("cannot read {} {}: {}{}", what, path.string(), refusal, hint);
  }
  size_ = static_cast<uint64_t>(status.st_size);
}

OpenFile::~OpenFile() {
  if (descriptor_ >= 0) ::close(descriptor_);
}

OpenFile::OpenFile(OpenFile&& other) noexcept
    : descriptor_(std::exchange(other.descriptor_, -1)), size_(std::exchange(other.size_, 0)) {}

OpenFile& OpenFile::operator=(OpenFile&& other) noexcept {
  if (this != &other) {
    if (descriptor_ >= 0) ::close(descriptor_);
    descriptor_ = std::exchange(other.descriptor_, -1);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

MappedFile::MappedFile(const std::filesystem::path& path, std::string_view what,
                       std::string_view hint) {
  const OpenFile file(path, what, hint);
  size_ = static_cast<size_t>(file.size());
  if (size_ == 0) return;  // mmap refuses a length of 0
  void* address = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, file.descriptor(), 0);
  if (address == MAP_FAILED) {
    fail("cannot map {} {}: {}", what, path.string(), std::strerror(errno));
  }
  address_ = static_cast<const std::byte*>(address);
}

MappedFile::~MappedFile() {
  if (address_ != nullptr) ::munmap(const_cast<std::byte*>(address_), size_);
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : address_(std::exchange(other.address_, nullptr)), size_(std::exchange(other.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    if (address_ != nullptr) ::munmap(const_cast<std::byte*>(address_), size_);
    address_ = std::exchange(other.address_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

}  // namespace common
