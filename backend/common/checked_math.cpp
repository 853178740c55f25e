// Overflow-checked size arithmetic; see checked_math.hpp.
#include "backend/common/checked_math.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <limits>

#include "backend/common/error.hpp"

namespace common {

namespace {
constexpr int64_t kLargest = std::numeric_limits<int64_t>::max();
}  // namespace

int64_t checked_multiply(std::initializer_list<int64_t> factors, std::string_view what) {
  int64_t product = 1;
  for (const int64_t factor : factors) {
    if (__builtin_mul_overflow(product, factor, &product)) {
      fail("{}: {} exceeds {}, the largest size this program counts in", what,
           fmt::join(factors, " × "), kLargest);
    }
  }
  return product;
}

int64_t checked_add(int64_t a, int64_t b, std::string_view what) {
  int64_t sum = 0;
  if (__builtin_add_overflow(a, b, &sum)) {
    fail("{}: {} + {} exceeds {}, the largest size this program counts in", what, a, b, kLargest);
  }
  return sum;
}

std::optional<int64_t> exact_product(std::span<const int64_t> factors) {
  for (const int64_t factor : factors) {
    if (factor == 0) return 0;
  }
  int64_t product = 1;
  for (const int64_t factor : factors) {
    if (__builtin_mul_overflow(product, factor, &product)) return std::nullopt;
  }
  return product;
}

}  // namespace common
