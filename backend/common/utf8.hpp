// UTF-8 well-formedness, shared by the launcher (config files and overrides must be UTF-8, as
// Hydra reads them) and the data tools (the tokenizer repairs invalid text).
//
// Well-formed is Unicode's Table 3-7 (section 3.9): no overlong forms, no surrogates, nothing
// above U+10FFFF. An ill-formed sequence is measured as its "maximal subpart" (Unicode 15,
// section 3.9, "U+FFFD Substitution of Maximal Subparts"), the unit that Python's
// bytes.decode("utf-8", "replace") and the WHATWG decoder replace by one U+FFFD.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace common {

// The length of the well-formed sequence starting at bytes[i] (1 for ASCII), or the negated
// length of its maximal ill-formed subpart (at least 1) when it is not well-formed.
int utf8_sequence_length(std::string_view bytes, std::size_t i);

// The offset of the first byte that is not part of well-formed UTF-8, if any.
std::optional<std::size_t> first_invalid_utf8(std::string_view bytes);

// `bytes` with each byte of an ill-formed sequence written as \xNN, for error messages that
// quote user input without passing invalid UTF-8 on to the terminal.
std::string escape_invalid_utf8(std::string_view bytes);

}  // namespace common
