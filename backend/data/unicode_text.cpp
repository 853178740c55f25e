// UTF-8 validation and WHATWG-style repair, and the GPT-2 pattern's character classes
// (see unicode_text.hpp for the definitions and their sources).
#include "backend/data/unicode_text.hpp"

#include <utf8proc.h>

#include "backend/common/utf8.hpp"

namespace backend {
namespace {

bool is_white_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

}  // namespace

bool is_valid_utf8(std::string_view bytes) {
  return !common::first_invalid_utf8(bytes);
}

void replace_invalid_utf8(std::string_view bytes, std::string& out) {
  out.clear();
  out.reserve(bytes.size() + bytes.size() / 2);
  size_t i = 0;
  while (i < bytes.size()) {
    const int length = common::utf8_sequence_length(bytes, i);
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
