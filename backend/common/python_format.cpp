// Python's float and tuple formatting; see python_format.hpp.
#include "backend/common/python_format.hpp"

#include <fmt/format.h>

#include <cmath>

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

}  // namespace common
