// See numeric_flag.hpp.
#include "backend/common/numeric_flag.hpp"

#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <string>
#include <string_view>

namespace common {

namespace {

// The text without one leading '+', which Python's int() and float() accept and from_chars not.
std::string_view unsigned_text(std::string_view text) {
  if (text.size() > 1 && text.front() == '+' && text[1] != '-') text.remove_prefix(1);
  return text;
}

}  // namespace

CLI::Validator integer_in_range(int64_t min, int64_t max) {
  const std::string valid = fmt::format("an integer from {} to {}", min, max);
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        const std::string_view digits = unsigned_text(text);
        int64_t value = 0;
        const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
        if (digits.empty() || error != std::errc() || end != digits.data() + digits.size() ||
            value < min || value > max) {
          return fmt::format("{} is not {}", text, valid);
        }
        return "";
      },
      fmt::format("INT in [{}, {}]", min, max));
}

CLI::Validator real_in_range(double min, double max) {
  const std::string valid = fmt::format("a number from {} to {}", min, max);
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        const std::string_view digits = unsigned_text(text);
        double value = 0;
        const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
        if (digits.empty() || error != std::errc() || end != digits.data() + digits.size() ||
            !std::isfinite(value) || value < min || value > max) {
          return fmt::format("{} is not {}", text, valid);
        }
        return "";
      },
      fmt::format("FLOAT in [{}, {}]", min, max));
}

}  // namespace common
