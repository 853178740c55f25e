// UTF-8 well-formedness; see utf8.hpp.
#include "backend/common/utf8.hpp"

#include <fmt/format.h>

#include <cstdint>
#include <cstring>

namespace common {

namespace {

// For a lead byte of a multi-byte sequence: its length and the range its first continuation
// byte must fall in (Unicode Table 3-7); length 0 for bytes that cannot start a sequence.
struct LeadByte {
  int length;
  unsigned char first_low, first_high;
};

LeadByte lead_byte(unsigned char lead) {
  if (lead >= 0xC2 && lead <= 0xDF) return {2, 0x80, 0xBF};
  if (lead == 0xE0) return {3, 0xA0, 0xBF};                    // no overlongs
  if (lead == 0xED) return {3, 0x80, 0x9F};                    // no surrogates
  if (lead >= 0xE1 && lead <= 0xEF) return {3, 0x80, 0xBF};
  if (lead == 0xF0) return {4, 0x90, 0xBF};                    // no overlongs
  if (lead >= 0xF1 && lead <= 0xF3) return {4, 0x80, 0xBF};
  if (lead == 0xF4) return {4, 0x80, 0x8F};                    // nothing above U+10FFFF
  return {0, 0, 0};
}

// Index of the first byte ≥ 0x80 at or after `i`, eight bytes at a time.
std::size_t skip_ascii(std::string_view bytes, std::size_t i) {
  while (i + 8 <= bytes.size()) {
    std::uint64_t word;
    std::memcpy(&word, bytes.data() + i, 8);
    if (word & 0x8080808080808080ull) break;
    i += 8;
  }
  while (i < bytes.size() && static_cast<unsigned char>(bytes[i]) < 0x80) ++i;
  return i;
}

}  // namespace

int utf8_sequence_length(std::string_view bytes, std::size_t i) {
  if (static_cast<unsigned char>(bytes[i]) < 0x80) return 1;
  const LeadByte lead = lead_byte(static_cast<unsigned char>(bytes[i]));
  if (lead.length == 0) return -1;
  std::size_t j = i + 1;
  for (int k = 1; k < lead.length; ++k, ++j) {
    const unsigned char low = k == 1 ? lead.first_low : 0x80;
    const unsigned char high = k == 1 ? lead.first_high : 0xBF;
    if (j >= bytes.size()) return -static_cast<int>(j - i);
    const auto byte = static_cast<unsigned char>(bytes[j]);
    if (byte < low || byte > high) return -static_cast<int>(j - i);
  }
  return lead.length;
}

std::optional<std::size_t> first_invalid_utf8(std::string_view bytes) {
  std::size_t i = 0;
  while (true) {
    i = skip_ascii(bytes, i);
    if (i >= bytes.size()) return std::nullopt;
    const int length = utf8_sequence_length(bytes, i);
    if (length < 0) return i;
    i += static_cast<std::size_t>(length);
  }
}

std::string escape_invalid_utf8(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  std::size_t i = 0;
  while (i < bytes.size()) {
    const int length = utf8_sequence_length(bytes, i);
    if (length > 0) {
      out.append(bytes.substr(i, static_cast<std::size_t>(length)));
      i += static_cast<std::size_t>(length);
      continue;
    }
    for (int k = 0; k < -length; ++k, ++i) {
      out += fmt::format("\\x{:02x}", static_cast<unsigned char>(bytes[i]));
    }
  }
  return out;
}

}  // namespace common
