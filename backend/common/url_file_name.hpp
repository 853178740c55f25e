// The file name a URL names: the last segment of its path, without query or fragment, with
// %XX escapes decoded (RFC 3986 §3.3, §2.1), as wget and `curl -O` name what they save.
// Shared by the download tool (its default output) and the launcher's data_preparation stage
// (where each shard lands).
#pragma once

#include <cstddef>
#include <string>

namespace common {

// NAME_MAX of Linux's file systems: the longest name one directory entry holds. A URL's file
// name may be longer (a URL has no such limit); its users check it against this.
inline constexpr size_t kMaxFileNameBytes = 255;

// Empty when the URL names no file: a path ending in '/', none at all, "." or "..", or a
// segment that decodes to something holding '/' or a NUL.
std::string url_file_name(const std::string& url);

}  // namespace common
