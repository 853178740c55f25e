// Overflow-checked size arithmetic: exact results in range, an error naming what was computed
// and the operands outside it (never a wrapped value).
#include "backend/common/checked_math.hpp"

#include <doctest/doctest.h>

#include <limits>

#include "backend/common/error.hpp"

TEST_CASE("products and sums that fit are exact — those that do not are errors naming them") {
  constexpr int64_t largest = std::numeric_limits<int64_t>::max();
  CHECK(common::checked_multiply(3, 4, "x") == 12);
  CHECK(common::checked_multiply({2, 3, 7}, "x") == 42);
  CHECK(common::checked_multiply({}, "x") == 1);
  CHECK(common::checked_multiply(largest, 1, "x") == largest);
  CHECK(common::checked_multiply(-4, 2, "x") == -8);
  CHECK_THROWS_WITH_AS(common::checked_multiply(2305843009213693952, 4, "the MLP size"),
                       "the MLP size: 2305843009213693952 × 4 exceeds 9223372036854775807, the "
                       "largest size this program counts in",
                       common::Error);
  CHECK_THROWS_WITH_AS(common::checked_multiply({1 << 30, 1 << 30, 1 << 30}, "rows"),
                       doctest::Contains("rows: 1073741824 × 1073741824 × 1073741824 exceeds"),
                       common::Error);
  CHECK(common::checked_add(largest - 1, 1, "x") == largest);
  CHECK_THROWS_WITH_AS(common::checked_add(largest, 1, "the padded vocabulary"),
                       doctest::Contains("the padded vocabulary: 9223372036854775807 + 1 exceeds"),
                       common::Error);
}
