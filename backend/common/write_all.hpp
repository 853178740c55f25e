// Writing a buffer whole to a file descriptor: write(2) and pwrite(2) may write less than asked
// (a pipe, a signal, a full disk part-way) or be interrupted before writing anything (EINTR);
// the loop that retries both is here once, for every writer (the durable files, the tools'
// output, the indexed-dataset builder, downloads).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <optional>

namespace common {

// Writes all `size` bytes of `data` to `descriptor`, at `offset` (pwrite) when given, else at
// the descriptor's position. 0 when all were written, else the errno of the write that failed
// (EIO for a write that wrote nothing without an error); the caller names the file in its message.
int write_all(int descriptor, const void* data, size_t size, std::optional<off_t> offset = std::nullopt);

}  // namespace common
