// POSIX single quotes, or bash ANSI-C quotes for words with control characters; see
// shell_quote.hpp.
#include "launcher/shell_quote.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "backend/common/error.hpp"

namespace launcher {

namespace {
bool is_safe(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
         std::string_view("_@%+=:,./-").find(c) != std::string_view::npos;
}

bool is_control(char c) {
  const auto byte = static_cast<unsigned char>(c);
  return byte < 0x20 || byte == 0x7f;
}

std::string ansi_c_quote(std::string_view word) {
  std::string quoted = "$'";
  for (char c : word) {
    switch (c) {
      case '\\': quoted += "\\\\"; break;
      case '\'': quoted += "\\'"; break;
      case '\n': quoted += "\\n"; break;
      case '\t': quoted += "\\t"; break;
      case '\r': quoted += "\\r"; break;
      default:
        // Always two hex digits: bash's \xHH takes at most two, so a digit after it stays a digit.
        quoted += is_control(c) ? fmt::format("\\x{:02x}", static_cast<unsigned char>(c)) : std::string(1, c);
    }
  }
  quoted += '\'';
  return quoted;
}
}  // namespace

std::string shell_quote(std::string_view word) {
  if (!word.empty() && std::all_of(word.begin(), word.end(), is_safe)) return std::string(word);
  if (word.find('\0') != std::string_view::npos) {
    common::fail("the value {:?} holds a NUL byte, which no shell word can hold", word);
  }
  if (std::any_of(word.begin(), word.end(), is_control)) return ansi_c_quote(word);
  std::string quoted = "'";
  for (char c : word) {
    if (c == '\'') {
      quoted += "'\\''";
    } else {
      quoted += c;
    }
  }
  quoted += '\'';
  return quoted;
}

std::string shell_join(const std::vector<std::string>& words) {
  std::string joined;
  for (const auto& word : words) {
    if (!joined.empty()) joined += ' ';
    joined += shell_quote(word);
  }
  return joined;
}

bool is_shell_identifier(std::string_view name) {
  auto head = [](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; };
  auto tail = [&](char c) { return head(c) || (c >= '0' && c <= '9'); };
  return !name.empty() && head(name.front()) && std::all_of(name.begin() + 1, name.end(), tail);
}

}  // namespace launcher
