// Writing a buffer whole; see write_all.hpp.
#include "backend/common/write_all.hpp"

#include <unistd.h>

#include <cerrno>

namespace common {

int write_all(int descriptor, const void* data, size_t size, std::optional<off_t> offset) {
  const char* next = static_cast<const char*>(data);
  size_t left = size;
  while (left > 0) {
    const ssize_t written = offset ? ::pwrite(descriptor, next, left, *offset + static_cast<off_t>(size - left))
                                   : ::write(descriptor, next, left);
    if (written < 0 && errno == EINTR) continue;
    if (written < 0) return errno;
    if (written == 0) return EIO;
    next += written;
    left -= static_cast<size_t>(written);
  }
  return 0;
}

}  // namespace common
