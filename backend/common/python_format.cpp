// Python's float and tuple formatting, and float() of a word; see python_format.hpp. The
// grammar is the one Python's documentation gives for float() (floatvalue: sign, digitpart
// with underscores, fraction, exponent, infinity, nan).
#include "backend/common/python_format.hpp"

#include <fmt/format.h>

#include <cmath>
#include <cstdlib>
#include <limits>

#include "backend/common/ascii_case.hpp"

namespace common {

std::string format_python_float(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  // Python's repr and fmt's "{}" agree on the digits and the switch to exponents; Python adds
  // ".0" to an integral value.
  std::string text = fmt::format("{}", value);
  if (text.find_first_of(".e") == std::string::npos) text += ".0";
  return text;
}

std::string format_python_shape(std::span<const int64_t> shape) {
  std::string text = "(";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + (shape.size() == 1 ? ",)" : ")");
}

namespace {

bool is_ascii_digit(char c) { return c >= '0' && c <= '9'; }

// digitpart ::= digit (["_"] digit)*, from text[at]; its digits are appended to `digits`.
bool take_digit_part(std::string_view text, size_t& at, std::string& digits) {
  if (at >= text.size() || !is_ascii_digit(text[at])) return false;
  digits.push_back(text[at++]);
  while (at < text.size()) {
    if (is_ascii_digit(text[at])) {
      digits.push_back(text[at++]);
    } else if (text[at] == '_' && at + 1 < text.size() && is_ascii_digit(text[at + 1])) {
      ++at;
    } else {
      break;
    }
  }
  return true;
}

}  // namespace

std::optional<double> parse_python_float(std::string_view text) {
  // float() strips the C whitespace (not \x1c..\x1f, which str.strip() would take).
  const auto is_space = [](char c) { return c == ' ' || (c >= '\t' && c <= '\r'); };
  while (!text.empty() && is_space(text.front())) text.remove_prefix(1);
  while (!text.empty() && is_space(text.back())) text.remove_suffix(1);
  std::string number;  // what strtod reads: the sign, digits, '.', 'e', without underscores
  size_t at = 0;
  if (at < text.size() && (text[at] == '+' || text[at] == '-')) number.push_back(text[at++]);
  const std::string rest = ascii_lowercase(text.substr(at));
  const bool negative = !number.empty() && number[0] == '-';
  if (rest == "inf" || rest == "infinity") {
    return negative ? -std::numeric_limits<double>::infinity()
                    : std::numeric_limits<double>::infinity();
  }
  if (rest == "nan") return std::numeric_limits<double>::quiet_NaN();
  const bool integer_part = take_digit_part(text, at, number);
  bool fraction_part = false;
  if (at < text.size() && text[at] == '.') {
    number.push_back(text[at++]);
    fraction_part = take_digit_part(text, at, number);
  }
  if (!integer_part && !fraction_part) return std::nullopt;
  if (at < text.size() && (text[at] == 'e' || text[at] == 'E')) {
    number.push_back(text[at++]);
    if (at < text.size() && (text[at] == '+' || text[at] == '-')) number.push_back(text[at++]);
    if (!take_digit_part(text, at, number)) return std::nullopt;
  }
  if (at != text.size()) return std::nullopt;
  // glibc's strtod rounds correctly, as Python does; out of range it gives ±HUGE_VAL (inf) or
  // the nearest subnormal or zero, which is Python's value too (errno is not needed).
  return std::strtod(number.c_str(), nullptr);
}

}  // namespace common
