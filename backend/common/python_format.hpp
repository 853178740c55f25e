// How Python prints numbers, for log lines that must match Megatron's byte for byte.
#pragma once

#include <string>

namespace common {

// Python's str(float) / repr: the shortest round-trip digits, positional for 1e-4 ≤ |x| < 1e16
// and like 1e-05 outside, with ".0" on an integral value (1.0, 1.25, nan, inf).
std::string format_python_float(double value);

}  // namespace common
