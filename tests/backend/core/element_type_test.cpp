// The host conversions of element_type.hpp for the 2-byte types: fp32 → fp16 (to_float16) and
// back (to_float), checked over every fp16 value and every rounding boundary between them
// rather than against a second implementation of the same formulas: the decoding is pinned by
// IEEE 754 binary16's defining values, and the rounding by the midpoints of the decoded values.
#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "backend/core/element_type.hpp"

using backend::float16;
using backend::to_float;
using backend::to_float16;

namespace {

uint16_t bits_of(float value) {
  return to_float16(value).bits;
}

bool is_nan_bits(uint16_t bits) {
  return (bits & 0x7c00u) == 0x7c00u && (bits & 0x03ffu) != 0;
}

}  // namespace

TEST_CASE("fp16 decodes binary16's defining values") {
  CHECK(to_float(float16{0x3c00}) == 1.0f);
  CHECK(to_float(float16{0xc000}) == -2.0f);
  CHECK(to_float(float16{0x7bff}) == 65504.0f);      // the largest finite
  CHECK(to_float(float16{0x0400}) == 0x1p-14f);      // the smallest normal
  CHECK(to_float(float16{0x0001}) == 0x1p-24f);      // the smallest subnormal
  CHECK(to_float(float16{0x03ff}) == 1023 * 0x1p-24f);  // the largest subnormal
  CHECK(to_float(float16{0x3555}) == 0x1.554p-2f);   // ≈ 1/3
  CHECK(to_float(float16{0x7c00}) == std::numeric_limits<float>::infinity());
  CHECK(to_float(float16{0xfc00}) == -std::numeric_limits<float>::infinity());
  CHECK(std::signbit(to_float(float16{0x8000})));
  CHECK(std::isnan(to_float(float16{0x7e00})));
}

TEST_CASE("fp16 round-trips every value, and rounds every midpoint to the even neighbour") {
  // All finite non-negative values in increasing order of bits are increasing in value.
  std::vector<float> values;
  for (uint32_t bits = 0; bits < 0x7c00u; ++bits) {
    const float value = to_float(float16{static_cast<uint16_t>(bits)});
    if (!values.empty()) REQUIRE(value > values.back());
    values.push_back(value);
    REQUIRE(bits_of(value) == bits);
    REQUIRE(bits_of(-value) == (bits | 0x8000u));
  }
  for (size_t i = 0; i + 1 < values.size(); ++i) {
    const float low = values[i];
    const float high = values[i + 1];
    const float midpoint = low + (high - low) / 2;  // exact: fp16's spacing is far above fp32's
    const auto even = static_cast<uint16_t>(i % 2 == 0 ? i : i + 1);
    REQUIRE(bits_of(midpoint) == even);
    REQUIRE(bits_of(std::nextafter(midpoint, 0.0f)) == i);
    REQUIRE(bits_of(std::nextafter(midpoint, 1e9f)) == i + 1);
  }
}

TEST_CASE("fp16 overflows to inf from 65520 up, flushes below 2^-25 to zero, keeps NaN") {
  CHECK(bits_of(65519.996f) == 0x7bff);
  CHECK(bits_of(65520.0f) == 0x7c00);  // the tie between 65504 and 65536 goes to inf (even)
  CHECK(bits_of(-1e30f) == 0xfc00);
  CHECK(bits_of(std::numeric_limits<float>::max()) == 0x7c00);
  CHECK(bits_of(std::numeric_limits<float>::infinity()) == 0x7c00);
  CHECK(bits_of(0x1p-25f) == 0x0000);  // a tie between 0 and 2^-24: to 0
  CHECK(bits_of(std::nextafter(0x1p-25f, 1.0f)) == 0x0001);
  CHECK(bits_of(-0x1p-26f) == 0x8000);
  CHECK(bits_of(std::numeric_limits<float>::denorm_min()) == 0x0000);
  CHECK(bits_of(-0.0f) == 0x8000);
  const uint16_t nan = bits_of(std::numeric_limits<float>::quiet_NaN());
  CHECK(is_nan_bits(nan));
  CHECK((nan & 0x0200u) != 0);  // quiet
  // A signalling NaN whose payload lies below fp16's bits still comes back a NaN.
  CHECK(is_nan_bits(bits_of(std::bit_cast<float>(0x7f800001u))));
}
