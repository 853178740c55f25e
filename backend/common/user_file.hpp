// Opening a file a user names, for reading: the checks every reader makes before it trusts a
// byte, in one place, and the descriptor or mapping owned by an object, so that a reader whose
// constructor refuses the file gives it back (a constructor that throws runs its members'
// destructors, not its own; a process that goes on after the error, a server or a fuzzer,
// would otherwise run out of descriptors or address space).
//
// The file must be a regular file: a directory, FIFO, device or socket is refused before a byte
// is read (a FIFO is opened with O_NONBLOCK, so it is not waited on; /dev/zero would map or
// read forever). Every refusal is a common::Error
//   "cannot read <what> <path>: <reason><hint>"
// where `what` names the file's role ("checkpoint", "--vocab-file", "dataset file"), the
// reason is the system's ("No such file or directory") or what the file is ("it is a FIFO
// (named pipe), not a regular file"), and `hint` (may be empty) says what would be valid.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string_view>

namespace common {

// What a file of mode `mode` (stat's st_mode) is when it is not a regular file, as every
// refusal says it: "a FIFO (named pipe), not a regular file", "a directory, not a file";
// nullptr for a regular file. Shared with the writers' rule (durable_file.hpp).
const char* describe_non_regular(mode_t mode);

// A regular file open read-only, closed with the object.
class OpenFile {
 public:
  OpenFile(const std::filesystem::path& path, std::string_view what, std::string_view hint = {});
  ~OpenFile();
  OpenFile(OpenFile&& other) noexcept;
  OpenFile& operator=(OpenFile&& other) noexcept;
  OpenFile(const OpenFile&) = delete;
  OpenFile& operator=(const OpenFile&) = delete;

  int descriptor() const { return descriptor_; }
  uint64_t size() const { return size_; }  // when it was opened

 private:
  int descriptor_ = -1;
  uint64_t size_ = 0;
};

// A whole regular file mapped read-only (an empty file maps to no bytes), unmapped with the
// object: for the files read in place rather than copied (Megatron's .idx and .bin, .npy). The
// descriptor is closed once the mapping is made. A failed mapping is
// "cannot map <what> <path>: <reason>".
class MappedFile {
 public:
  MappedFile(const std::filesystem::path& path, std::string_view what, std::string_view hint = {});
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  std::span<const std::byte> bytes() const { return {address_, size_}; }

 private:
  const std::byte* address_ = nullptr;
  size_t size_ = 0;
};

}  // namespace common
