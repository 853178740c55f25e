// Overflow-checked arithmetic on sizes. Every place that multiplies sizes a user gives (the
// model's shape and parameter layout, activation buffers, schedule lengths counted in samples
// or tokens, vocabulary padding; in the backend and in the launcher's preflight) goes through
// these, so a product that does not fit int64 is a common::Error naming what was computed and
// from which values, never a wrapped (negative, or small) size that later crashes or allocates
// without bound. The check is the compiler's __builtin_*_overflow (GCC and Clang).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <span>
#include <string_view>

namespace common {

// The product of `factors`, or common::Error "<what>: 2305843009213693952 × 4 exceeds
// 9223372036854775807, the largest size this program counts in".
int64_t checked_multiply(std::initializer_list<int64_t> factors, std::string_view what);
inline int64_t checked_multiply(int64_t a, int64_t b, std::string_view what) {
  return checked_multiply({a, b}, what);
}

// The product of non-negative `factors` in exact arithmetic (0 when any is 0, whatever the
// others), or nullopt when it does not fit int64: for sizes read from a file, whose reader
// words its own refusal.
std::optional<int64_t> exact_product(std::span<const int64_t> factors);

// a + b, or common::Error naming `what` the same way.
int64_t checked_add(int64_t a, int64_t b, std::string_view what);

}  // namespace common
