// How Python prints numbers and shapes, for log lines, messages and file headers that must
// match Megatron's and numpy's byte for byte.
#pragma once

#include <cstdint>
#include <span>
#include <string>

namespace common {

// Python's str(float) / repr: the shortest round-trip digits, positional for 1e-4 ≤ |x| < 1e16
// and like 1e-05 outside, with ".0" on an integral value (1.0, 1.25, nan, inf).
std::string format_python_float(double value);

// Python's repr of a tuple of ints, as numpy's .npy headers and Megatron's and PyTorch's
// messages show shapes: "(4096,)", "(32, 4096)", "()".
std::string format_python_shape(std::span<const int64_t> shape);

}  // namespace common
