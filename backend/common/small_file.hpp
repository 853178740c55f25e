// Reading a whole user-named file into memory, bounded: the one way every tool reads the small
// files a user names or a run leaves behind (tokenizer files, data lists, per-split JSON,
// Hugging Face config.json, checkpoint trackers, the launcher's config files and job records).
// The file must be a regular file (not a directory, FIFO, device or socket: /dev/zero would be
// read forever, a FIFO would block) of at most `limit` bytes; anything else is a common::Error
// naming what the file is for, the path and the limit, before a byte is read. The read itself
// stops just past the limit, so a file that grows while it is read is refused too.
//
// The default limit is 256 MiB: the largest of these files in real use is a tokenizer's
// vocabulary (GPT-2's vocab.json is 1 MB, its merges.txt 456 kB; a 250k-token vocabulary a few
// MB), so the limit is generous and still far below what a 2-core machine can hold.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

namespace common {

inline constexpr uint64_t kSmallFileLimit = uint64_t{256} << 20;

// The contents of `path`, or common::Error
//   "cannot read <what> <path>: it is a FIFO (named pipe), not a regular file"
//   "cannot read <what> <path>: it is 1099511627776 bytes, more than the 268435456 bytes
//    (256 MiB) a file read whole may have"
//   "cannot read <what> <path>: No such file or directory".
// `what` names the file's role: a flag ("--vocab-file") or a description ("the job records").
std::string read_small_file(const std::filesystem::path& path, std::string_view what,
                            uint64_t limit = kSmallFileLimit);

// The same, or nullopt when nothing is at `path` (a cache or a tracker not written yet); what
// is there and cannot be read whole (a dangling link, a FIFO, ...) is refused as above.
std::optional<std::string> read_small_file_if_exists(const std::filesystem::path& path,
                                                     std::string_view what,
                                                     uint64_t limit = kSmallFileLimit);

}  // namespace common
