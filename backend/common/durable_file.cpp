// Durable writes, directory fsync and atomic replacement; see durable_file.hpp.
#include "backend/common/durable_file.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <vector>

#include "backend/common/error.hpp"
#include "backend/common/user_file.hpp"
#include "backend/common/write_all.hpp"

namespace common {

namespace {

std::string error_text() { return std::strerror(errno); }

}  // namespace

DurableFileWriter::DurableFileWriter(std::filesystem::path path) : path_(std::move(path)) {
  descriptor_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (descriptor_ < 0) fail("cannot create {}: {}", path_.string(), error_text());
}

DurableFileWriter DurableFileWriter::temporary_for(const std::filesystem::path& target) {
  const std::string suffix = ".tmp-" + std::to_string(::getpid()) + "-XXXXXX";
  constexpr size_t kMaxFileName = 255;
  std::string name = target.filename().string();
  if (name.size() + suffix.size() > kMaxFileName) name.resize(kMaxFileName - suffix.size());
  std::string pattern = (target.parent_path() / (name + suffix)).string();
  const int descriptor = ::mkostemp(pattern.data(), O_CLOEXEC);
  if (descriptor < 0) {
    fail("cannot write {}: cannot create its temporary {}: {}", target.string(), pattern,
         error_text());
  }
  // mkstemp creates 0600; these are ordinary data files, readable as the umask allows.
  const mode_t mask = ::umask(0);
  ::umask(mask);
  ::fchmod(descriptor, 0666 & ~mask);
  return DurableFileWriter(pattern, descriptor);
}

DurableFileWriter::~DurableFileWriter() {
  if (descriptor_ >= 0) ::close(descriptor_);
}

void DurableFileWriter::write(std::span<const std::byte> bytes) {
  if (const int error = write_all(descriptor_, bytes.data(), bytes.size()); error != 0) {
    fail("cannot write {}: {}", path_.string(), std::strerror(error));
  }
  bytes_written_ += bytes.size();
}

void DurableFileWriter::write_zeros(size_t count) {
  static const std::vector<std::byte> zeros(4096, std::byte{0});
  while (count > 0) {
    const size_t piece = std::min(count, zeros.size());
    write({zeros.data(), piece});
    count -= piece;
  }
}

void DurableFileWriter::make_executable() {
  struct stat status {};
  if (::fstat(descriptor_, &status) != 0 ||
      ::fchmod(descriptor_, (status.st_mode & 07777) | S_IXUSR | S_IXGRP) != 0) {
    fail("cannot make {} executable: {}", path_.string(), error_text());
  }
}

void DurableFileWriter::finish() {
  if (::fsync(descriptor_) != 0) fail("cannot fsync {}: {}", path_.string(), error_text());
  const int descriptor = descriptor_;
  descriptor_ = -1;
  if (::close(descriptor) != 0) fail("cannot close {}: {}", path_.string(), error_text());
}

OutputTarget output_target(const std::filesystem::path& path, std::string_view what) {
  const std::string named =
      what.empty() ? path.string() : fmt::format("{} {}", what, path.string());
  constexpr std::string_view kValid =
      "; give the path of a regular file to replace or of a new one";
  if (path.empty()) {
    fail("cannot write {}: the path is empty{}", what.empty() ? "a file" : what, kValid);
  }
  struct stat entry {};
  if (::lstat(path.c_str(), &entry) != 0) {
    // Nothing there: a new file (a missing directory is the writer's own error when it creates
    // the file). Anything else (a looping directory link, a name too long) is refused here.
    if (errno == ENOENT) return {path, -1};
    fail("cannot write {}: {}", named, error_text());
  }
  struct stat final_file {};
  const bool resolves = ::stat(path.c_str(), &final_file) == 0;
  const int resolve_errno = errno;
  if (resolves) {
    for (const int stream : {STDOUT_FILENO, STDERR_FILENO}) {
      struct stat standard {};
      if (::fstat(stream, &standard) == 0 && standard.st_dev == final_file.st_dev &&
          standard.st_ino == final_file.st_ino) {
        return {path, stream};
      }
    }
  }
  if (S_ISREG(entry.st_mode)) return {path, -1};
  if (!S_ISLNK(entry.st_mode)) {
    fail("cannot write {}: it is {}{}", named, describe_non_regular(entry.st_mode), kValid);
  }
  if (!resolves) {
    fail("cannot write {}: it is a symbolic link {}{}", named,
         resolve_errno == ENOENT ? "to nothing (dangling)"
         : resolve_errno == ELOOP ? "in a loop (Too many levels of symbolic links)"
                                  : fmt::format("whose target cannot be reached ({})",
                                                std::strerror(resolve_errno)),
         kValid);
  }
  if (!S_ISREG(final_file.st_mode)) {
    fail("cannot write {}: it is a symbolic link to {}{}", named,
         describe_non_regular(final_file.st_mode), kValid);
  }
  char* resolved = ::realpath(path.c_str(), nullptr);
  if (resolved == nullptr) {
    fail("cannot write {}: cannot resolve the symbolic link: {}", named, error_text());
  }
  std::filesystem::path file(resolved);
  std::free(resolved);
  return {std::move(file), -1};
}

std::filesystem::path replaceable_output_file(const std::filesystem::path& path,
                                              std::string_view what) {
  OutputTarget target = output_target(path, what);
  if (target.standard_stream >= 0) {
    fail("cannot write {}{}{}: it is this process's standard {}, and this file is built in pieces "
         "and renamed into place; give the path of a file", what, what.empty() ? "" : " ",
         path.string(), target.standard_stream == STDOUT_FILENO ? "output" : "error");
  }
  return std::move(target.file);
}

void fsync_directory(const std::filesystem::path& directory) {
  const int descriptor = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (descriptor < 0) fail("cannot open directory {}: {}", directory.string(), error_text());
  const int status = ::fsync(descriptor);
  const int fsync_errno = errno;
  ::close(descriptor);
  // Some file systems cannot fsync a directory (EINVAL); their renames are then as durable as
  // they can make them.
  if (status != 0 && fsync_errno != EINVAL) {
    fail("cannot fsync directory {}: {}", directory.string(), std::strerror(fsync_errno));
  }
}

void rename_path(const std::filesystem::path& from, const std::filesystem::path& to) {
  if (std::rename(from.c_str(), to.c_str()) != 0) {
    fail("cannot rename {} to {}: {}", from.string(), to.string(), error_text());
  }
}

namespace {

// `text` written into this process's standard output or error, after what the streams above
// it hold, so that the order on the terminal or in the pipe is the order of the writes.
void write_through(int descriptor, std::string_view text, const std::filesystem::path& path) {
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  if (const int error = write_all(descriptor, text.data(), text.size()); error != 0) {
    fail("cannot write {}: {}", path.string(), std::strerror(error));
  }
}

}  // namespace

void write_text_file_atomically(const std::filesystem::path& path, std::string_view text,
                                FileMode mode, std::string_view what) {
  const OutputTarget output = output_target(path, what);
  if (output.standard_stream >= 0) {
    write_through(output.standard_stream, text, path);
    return;
  }
  const std::filesystem::path& target = output.file;
  DurableFileWriter writer = DurableFileWriter::temporary_for(target);
  const std::filesystem::path temporary = writer.path();
  try {
    writer.write(std::as_bytes(std::span(text.data(), text.size())));
    if (mode == FileMode::executable) writer.make_executable();
    writer.finish();
    rename_path(temporary, target);
  } catch (const Error& error) {
    std::error_code ignored;
    std::filesystem::remove(temporary, ignored);
    fail("cannot write {}: {}", target.string(), error.what());
  }
  fsync_directory(target.parent_path().empty() ? std::filesystem::path(".") : target.parent_path());
}

void crash_point(std::string_view point) {
  const char* requested = std::getenv("MEGATRON_NATIVE_CRASH_AT");
  if (requested != nullptr && point == requested) ::raise(SIGKILL);
}

}  // namespace common
