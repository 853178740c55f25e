// UTF-8 validation and WHATWG-style repair, and the GPT-2 pattern's character classes
// (see unicode_text.hpp for the definitions and their sources).
#include "backend/data/unicode_text.hpp"

#include <utf8proc.h>

#include <cstring>

namespace backend {
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

// The length of the well-formed sequence at bytes[i], or −(bytes of its maximal ill-formed
// subpart) when it is not well-formed.
int sequence_length(std::string_view bytes, size_t i) {
  const LeadByte lead = lead_byte(static_cast<unsigned char>(bytes[i]));
  if (lead.length == 0) return -1;
  size_t j = i + 1;
  for (int k = 1; k < lead.length; ++k, ++j) {
    const unsigned char low = k == 1 ? lead.first_low : 0x80;
    const unsigned char high = k == 1 ? lead.first_high : 0xBF;
    if (j >= bytes.size()) return -static_cast<int>(j - i);
    const auto byte = static_cast<unsigned char>(bytes[j]);
    if (byte < low || byte > high) return -static_cast<int>(j - i);
  }
  return lead.length;
}

// Index of the first byte ≥ 0x80 at or after `i`, eight bytes at a time.
size_t skip_ascii(std::string_view bytes, size_t i) {
  while (i + 8 <= bytes.size()) {
    uint64_t word;
    std::memcpy(&word, bytes.data() + i, 8);
    if (word & 0x8080808080808080ull) break;
    i += 8;
  }
  while (i < bytes.size() && static_cast<unsigned char>(bytes[i]) < 0x80) ++i;
  return i;
}

bool is_white_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

}  // namespace

bool is_valid_utf8(std::string_view bytes) {
  size_t i = 0;
  while (true) {
    i = skip_ascii(bytes, i);
    if (i >= bytes.size()) return true;
    const int length = sequence_length(bytes, i);
    if (length < 0) return false;
    i += static_cast<size_t>(length);
  }
}

void replace_invalid_utf8(std::string_view bytes, std::string& out) {
  out.clear();
  out.reserve(bytes.size() + bytes.size() / 2);
  size_t i = 0;
  while (i < bytes.size()) {
    const size_t ascii_end = skip_ascii(bytes, i);
    out.append(bytes.data() + i, ascii_end - i);
    i = ascii_end;
    if (i >= bytes.size()) break;
    const int length = sequence_length(bytes, i);
    if (length > 0) {
      out.append(bytes.data() + i, static_cast<size_t>(length));
      i += static_cast<size_t>(length);
    } else {
      out.append("\xEF\xBF\xBD");
      i += static_cast<size_t>(-length);
    }
  }
}

std::string replace_invalid_utf8(std::string_view bytes) {
  std::string out;
  replace_invalid_utf8(bytes, out);
  return out;
}

CharacterClass character_class(char32_t code_point) {
  if (is_white_space(code_point)) return CharacterClass::whitespace;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(code_point))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
      return CharacterClass::letter;
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_NO:
      return CharacterClass::number;
    default:
      return CharacterClass::other;
  }
}

CharacterClasses::CharacterClasses() : bmp_(0x10000) {
  for (char32_t c = 0; c < 0x10000; ++c) bmp_[c] = static_cast<uint8_t>(character_class(c));
}

CharacterClass CharacterClasses::of_supplementary(char32_t code_point) {
  return character_class(code_point);  // no supplementary code point is White_Space
}

}  // namespace backend
