// The file name a URL names: the last segment of its path, without query or fragment, with
// %XX escapes decoded (RFC 3986 §3.3, §2.1), as wget and `curl -O` name what they save.
// Shared by the download tool (its default output) and the launcher's data_preparation stage
// (where each shard lands).
#pragma once

#include <string>

namespace common {

// Empty when the URL names no file: a path ending in '/', none at all, "." or "..", or a
// segment that decodes to something holding '/' or a NUL.
std::string url_file_name(const std::string& url);

}  // namespace common
