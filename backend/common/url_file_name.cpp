// The file name of a URL; see url_file_name.hpp.
#include "backend/common/url_file_name.hpp"

#include <cctype>

namespace common {

namespace {
int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  return std::tolower(static_cast<unsigned char>(c)) - 'a' + 10;
}
}  // namespace

std::string url_file_name(const std::string& url) {
  std::string path = url;
  const size_t scheme = path.find("://");
  if (scheme != std::string::npos) {
    path = path.substr(scheme + 3);
    const size_t slash = path.find('/');  // after the authority (host, port)
    path = slash == std::string::npos ? "" : path.substr(slash);
  }
  path = path.substr(0, path.find_first_of("?#"));
  const size_t last_slash = path.find_last_of('/');
  const std::string segment = last_slash == std::string::npos ? path : path.substr(last_slash + 1);
  std::string decoded;
  for (size_t i = 0; i < segment.size(); ++i) {
    if (segment[i] == '%' && i + 2 < segment.size() &&
        std::isxdigit(static_cast<unsigned char>(segment[i + 1])) &&
        std::isxdigit(static_cast<unsigned char>(segment[i + 2]))) {
      decoded += static_cast<char>(hex_value(segment[i + 1]) * 16 + hex_value(segment[i + 2]));
      i += 2;
    } else {
      decoded += segment[i];
    }
  }
  if (decoded == "." || decoded == ".." || decoded.find('/') != std::string::npos ||
      decoded.find('\0') != std::string::npos) {
    return {};
  }
  return decoded;
}

}  // namespace common
