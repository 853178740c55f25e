// UTF-8 validity (Unicode Table 3-7), U+FFFD substitution of maximal subparts (the Unicode
// Standard's own worked example, section 3.9), and the GPT-2 pattern's character classes
// checked against general categories and White_Space as Unicode publishes them.
#include <doctest/doctest.h>

#include <ios>
#include <initializer_list>
#include <string>

#include "backend/data/unicode_text.hpp"

using namespace backend;

namespace {
const std::string kReplacement = "\xEF\xBF\xBD";
std::string replacements(int count) {
  std::string out;
  for (int i = 0; i < count; ++i) out += kReplacement;
  return out;
}
// Concatenation by append (GCC 12 warns falsely about std::string's operator+ chains).
std::string join(std::initializer_list<std::string> parts) {
  std::string out;
  for (const std::string& part : parts) out.append(part);
  return out;
}
}  // namespace

TEST_CASE("well-formed UTF-8 is recognised, overlongs, surrogates and > U+10FFFF are not") {
  CHECK(is_valid_utf8(""));
  CHECK(is_valid_utf8("plain ASCII that is longer than eight bytes"));
  CHECK(is_valid_utf8("\xC2\x80 \xDF\xBF \xE0\xA0\x80 \xED\x9F\xBF \xEE\x80\x80 \xF0\x90\x80\x80 "
                      "\xF4\x8F\xBF\xBF"));
  CHECK_FALSE(is_valid_utf8("\xC0\xAF"));              // overlong '/'
  CHECK_FALSE(is_valid_utf8("\xE0\x80\xAF"));          // overlong
  CHECK_FALSE(is_valid_utf8("\xED\xA0\x80"));          // surrogate U+D800
  CHECK_FALSE(is_valid_utf8("\xF4\x90\x80\x80"));      // U+110000
  CHECK_FALSE(is_valid_utf8("abcdefgh\x80"));          // lone continuation after 8 ASCII
  CHECK_FALSE(is_valid_utf8("\xE2\x82"));              // truncated
  CHECK_FALSE(is_valid_utf8("\xF8\x88\x80\x80\x80"));  // 5-byte form
}

TEST_CASE("each maximal ill-formed subpart becomes one U+FFFD") {
  // Unicode 15.0, section 3.9, Table 3-8's example:
  //   61 F1 80 80 E1 80 C2 62 80 63 80 BF 64 → a FFFD FFFD FFFD b FFFD c FFFD FFFD d
  CHECK(replace_invalid_utf8("\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64") ==
        join({"a", replacements(3), "b", kReplacement, "c", replacements(2), "d"}));
  CHECK(replace_invalid_utf8("\xF0\x9F\x98") == replacements(1));      // a cut-off emoji
  CHECK(replace_invalid_utf8("\xC0\xAF") == replacements(2));          // C0 never starts one
  CHECK(replace_invalid_utf8("\xE0\x80\xAF") == replacements(3));      // 80 cannot follow E0
  CHECK(replace_invalid_utf8("\xED\xA0\x80") == replacements(3));      // nor A0 follow ED
  CHECK(replace_invalid_utf8("\xF4\x90\x80\x80") == replacements(4));  // nor 90 follow F4
  CHECK(replace_invalid_utf8("x\xE2\x82(") == join({"x", kReplacement, "("}));
  CHECK(replace_invalid_utf8("valid \xE2\x82\xAC stays") == "valid \xE2\x82\xAC stays");
  CHECK(replace_invalid_utf8("\xFF\xFE") == replacements(2));
}

TEST_CASE("character classes: letters, numbers, White_Space and everything else") {
  CHECK(character_class(U'a') == CharacterClass::letter);
  CHECK(character_class(U'\u00e9') == CharacterClass::letter);     // Ll
  CHECK(character_class(U'\u02b0') == CharacterClass::letter);     // Lm
  CHECK(character_class(U'\u4e2d') == CharacterClass::letter);     // Lo
  CHECK(character_class(U'\U00020000') == CharacterClass::letter); // Lo, plane 2
  CHECK(character_class(U'7') == CharacterClass::number);          // Nd
  CHECK(character_class(U'\u0663') == CharacterClass::number);     // Nd, Arabic-Indic
  CHECK(character_class(U'\u216b') == CharacterClass::number);     // Nl, Roman numeral
  CHECK(character_class(U'\u00bd') == CharacterClass::number);     // No
  CHECK(character_class(U'\U0001D7D9') == CharacterClass::number); // Nd, mathematical
  for (char32_t c : {U'\t', U'\n', U'\v', U'\f', U'\r', U' ', U'\u0085', U'\u00a0', U'\u1680',
                     U'\u2000', U'\u200a', U'\u2028', U'\u2029', U'\u202f', U'\u205f',
                     U'\u3000'}) {
    CHECK(character_class(c) == CharacterClass::whitespace);
  }
  // Not White_Space: information separators, Mongolian vowel separator (since Unicode 6.3),
  // zero-width space, byte order mark.
  for (char32_t c : {U'\u001c', U'\u001f', U'\u180e', U'\u200b', U'\ufeff'}) {
    CHECK(character_class(c) == CharacterClass::other);
  }
  CHECK(character_class(U'\u0301') == CharacterClass::other);      // Mn
  CHECK(character_class(U'\u0903') == CharacterClass::other);      // Mc
  CHECK(character_class(U'\U0001F600') == CharacterClass::other);  // So
  CHECK(character_class(U'\'') == CharacterClass::other);
  CHECK(character_class(U'\U000E0001') == CharacterClass::other);  // Cf (language tag)
  CHECK(character_class(U'\U0010FFFF') == CharacterClass::other);  // Cn

  const CharacterClasses table;
  for (char32_t c = 0; c <= 0x10FFFF; ++c) {
    if (table.of(c) != character_class(c)) {
      FAIL("table and utf8proc disagree at U+" << std::hex << uint32_t(c));
    }
  }
}
