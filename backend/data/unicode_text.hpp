// UTF-8 and Unicode character classes for the GPT-2 pre-tokenizer.
//
// UTF-8 validity is Unicode's Table 3-7 (well-formed byte sequences: no overlongs, no
// surrogates, nothing above U+10FFFF). Invalid input is repaired as the WHATWG Encoding
// Standard's decoder and Python's bytes.decode("utf-8", "replace") do: each maximal
// subpart of an ill-formed subsequence becomes one U+FFFD (Unicode 15, section 3.9, "U+FFFD
// Substitution of Maximal Subparts"). So "\xF0\x9F\x98" (an emoji cut short) is one U+FFFD,
// "\xC0\xAF" (an overlong '/') two, "\xED\xA0\x80" (a surrogate) three.
//
// Character classes are the ones GPT-2's pattern distinguishes: \p{L} (general categories Lu,
// Ll, Lt, Lm, Lo), \p{N} (Nd, Nl, No), \s and everything else. \s is the Unicode White_Space
// property, as in Python's `regex` module that OpenAI's encoder uses: U+0009..U+000D, U+0020,
// U+0085, U+00A0, U+1680, U+2000..U+200A, U+2028, U+2029, U+202F, U+205F, U+3000 (stable since
// Unicode 6.3 removed U+180E). General categories come from libutf8proc, so they follow its
// Unicode version (15.0 for Debian bookworm's 2.8.0); unassigned code points are "other".
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace backend {

// True when `bytes` is well-formed UTF-8.
bool is_valid_utf8(std::string_view bytes);

// Writes `bytes` to `out` (replacing its contents) with every maximal ill-formed subsequence
// replaced by U+FFFD (EF BF BD).
void replace_invalid_utf8(std::string_view bytes, std::string& out);
std::string replace_invalid_utf8(std::string_view bytes);

enum class CharacterClass : uint8_t { letter, number, whitespace, other };

// Decodes the code point at `p` of well-formed UTF-8 (the caller guarantees it); returns
// the number of bytes it took.
inline int decode_utf8(const unsigned char* p, char32_t& code_point) {
  const unsigned char lead = p[0];
  if (lead < 0x80) {
    code_point = lead;
    return 1;
  }
  if (lead < 0xE0) {
    code_point = (char32_t(lead & 0x1F) << 6) | (p[1] & 0x3F);
    return 2;
  }
  if (lead < 0xF0) {
    code_point = (char32_t(lead & 0x0F) << 12) | (char32_t(p[1] & 0x3F) << 6) | (p[2] & 0x3F);
    return 3;
  }
  code_point = (char32_t(lead & 0x07) << 18) | (char32_t(p[1] & 0x3F) << 12) |
               (char32_t(p[2] & 0x3F) << 6) | (p[3] & 0x3F);
  return 4;
}

// The class of every code point: a table for the Basic Multilingual Plane (where nearly all
// text lives), libutf8proc for the planes above.
class CharacterClasses {
 public:
  CharacterClasses();

  CharacterClass of(char32_t code_point) const {
    if (code_point < bmp_.size()) return static_cast<CharacterClass>(bmp_[code_point]);
    return of_supplementary(code_point);
  }

 private:
  static CharacterClass of_supplementary(char32_t code_point);
  std::vector<uint8_t> bmp_;  // 65,536 classes
};

// The class of a code point by the definitions above, straight from libutf8proc.
CharacterClass character_class(char32_t code_point);

}  // namespace backend
