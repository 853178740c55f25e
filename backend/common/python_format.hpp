// How Python prints numbers and shapes, for log lines, messages and file headers that must
// match Megatron's and numpy's byte for byte, and how it reads a number from a word, for the
// words Megatron passes to float() (a blend's weights).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace common {

// Python's str(float) / repr: the shortest round-trip digits, positional for 1e-4 ≤ |x| < 1e16
// and like 1e-05 outside, with ".0" on an integral value (1.0, 1.25, nan, inf).
std::string format_python_float(double value);

// Python's repr of a tuple of ints, as numpy's .npy headers and Megatron's and PyTorch's
// messages show shapes: "(4096,)", "(32, 4096)", "()".
std::string format_python_shape(std::span<const int64_t> shape);

// Python's float(text), or nullopt where it raises ValueError: surrounding whitespace, a sign,
// digits with single underscores between them ("1_000"), an optional fraction and exponent
// ("1.", ".5", "2.5e-3"), or "inf", "infinity", "nan" in any case. No hexadecimal, no "nan(...)"
// (which strtod alone would take). Correctly rounded as Python's: an overflow is ±inf ("1e400"),
// an underflow 0 or a subnormal ("1e-400"). Only ASCII digits and whitespace (Python also takes
// other Unicode decimal digits and spaces).
std::optional<double> parse_python_float(std::string_view text);

}  // namespace common
