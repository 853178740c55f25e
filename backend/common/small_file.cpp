// Bounded whole-file reads; see small_file.hpp.
#include "backend/common/small_file.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "backend/common/error.hpp"
#include "backend/common/user_file.hpp"

namespace common {

namespace {

[[noreturn]] void refuse_size(const std::filesystem::path& path, std::string_view what,
                              uint64_t size, bool at_least, uint64_t limit) {
  const std::string in_mib =
      limit % (1 << 20) == 0 ? fmt::format(" ({} MiB)", limit >> 20) : std::string();
  fail("cannot read {} {}: it is {}{} bytes, more than the {} bytes{} a file read whole may have",
       what, path.string(), at_least ? "at least " : "", size, limit, in_mib);
}

}  // namespace

std::string read_small_file(const std::filesystem::path& path, std::string_view what,
                            uint64_t limit) {
  const OpenFile file(path, what);
  const uint64_t size = file.size();
  if (size > limit) refuse_size(path, what, size, false, limit);

  std::string contents(static_cast<size_t>(size), '\0');
  size_t filled = 0;
  auto read_into = [&](char* buffer, size_t length) {
    while (true) {
      const ssize_t got = ::read(file.descriptor(), buffer, length);
      if (got >= 0) return static_cast<size_t>(got);
      if (errno != EINTR) fail("cannot read {} {}: {}", what, path.string(), std::strerror(errno));
    }
  };
  while (filled < contents.size()) {
    const size_t got = read_into(contents.data() + filled, contents.size() - filled);
    if (got == 0) break;  // it shrank
    filled += got;
  }
  contents.resize(filled);
  if (filled < size) return contents;
  // Past the size fstat gave (a file growing, or /proc's files, which say 0): read on, at most
  // one chunk past the limit.
  char chunk[1 << 16];
  while (const size_t got = read_into(chunk, sizeof chunk)) {
    contents.append(chunk, got);
    if (contents.size() > limit) refuse_size(path, what, contents.size(), true, limit);
  }
  return contents;
}

std::optional<std::string> read_small_file_if_exists(const std::filesystem::path& path,
                                                     std::string_view what, uint64_t limit) {
  struct stat status {};
  // ENOTDIR: a parent is a file; ENAMETOOLONG: no file can have that name. Either way nothing
  // is at `path`.
  if (::lstat(path.c_str(), &status) != 0 &&
      (errno == ENOENT || errno == ENOTDIR || errno == ENAMETOOLONG)) {
    return std::nullopt;
  }
  return read_small_file(path, what, limit);
}

}  // namespace common
