// The element types device memory holds, as a runtime value: the model picks its precision
// at run time (--bf16, --fp16, fp32 by default), so a buffer's type travels with it in a View
// rather than in a template parameter. i32 is for token and label ids, u64 for a captured step's
// dropout keys (dropout.hpp's Dropout::stored_key). (Not `DType`: that is
// the .idx files' element code in data/indexed_dataset.hpp, Megatron's name for it.)
#pragma once

#include <bit>
#include <cstdint>
#include <string_view>

namespace backend {

enum class ElementType : uint8_t { f32, f64, bf16, f16, i32, u64 };

constexpr int64_t element_size(ElementType dtype) {
  switch (dtype) {
    case ElementType::f64:
    case ElementType::u64:
      return 8;
    case ElementType::f32:
    case ElementType::i32: return 4;
    case ElementType::bf16:
    case ElementType::f16: return 2;
  }
  return 0;
}

constexpr std::string_view element_name(ElementType dtype) {
  switch (dtype) {
    case ElementType::f32: return "fp32";
    case ElementType::f64: return "fp64";
    case ElementType::bf16: return "bf16";
    case ElementType::f16: return "fp16";
    case ElementType::i32: return "int32";
    case ElementType::u64:
      return "uint64";
  }
  return "?";
}

// Host-side names of the 2-byte types, for declaring the CUDA twins without CUDA headers (the
// *_cuda.cu files reinterpret them as __nv_bfloat16 / __half, which have the same layout) and
// for moving values between host and device.
struct bfloat16 {
  uint16_t bits;
};
struct float16 {
  uint16_t bits;
};

// fp32 → bf16 with round-to-nearest-even (NaN stays a quiet NaN), as __float2bfloat16_rn.
inline bfloat16 to_bfloat16(float value) {
  const auto bits = std::bit_cast<uint32_t>(value);
  if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu) != 0) {
    return {static_cast<uint16_t>((bits >> 16) | 0x0040u)};
  }
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return {static_cast<uint16_t>((bits + rounding) >> 16)};
}
inline float to_float(bfloat16 value) {
  return std::bit_cast<float>(static_cast<uint32_t>(value.bits) << 16);
}

// fp32 → IEEE binary16 with round-to-nearest-even, as __float2half_rn: magnitudes from 65520
// up become inf, below 2^-14 subnormal (units of 2^-24), below 2^-25 (and a tie at it) zero,
// the sign kept; NaN stays a quiet NaN with the payload's top bits.
inline float16 to_float16(float value) {
  const auto bits = std::bit_cast<uint32_t>(value);
  const auto sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) {
    return {static_cast<uint16_t>(sign | 0x7e00u | ((magnitude >> 13) & 0x03ffu))};
  }
  if (magnitude >= 0x477ff000u) return {static_cast<uint16_t>(sign | 0x7c00u)};  // ≥ 65520
  if (magnitude >= 0x38800000u) {  // a normal half: rebias the exponent (127 → 15), round
    const uint32_t rounded = magnitude + 0x0fffu + ((magnitude >> 13) & 1u);
    return {static_cast<uint16_t>(sign | ((rounded - 0x38000000u) >> 13))};
  }
  // Subnormal: the significand (with its implicit bit) in units of 2^-24, rounded; a carry into
  // 0x400 is the smallest normal, which is the right encoding.
  const uint32_t exponent = magnitude >> 23;
  const uint32_t shift = 126u - exponent;  // ≥ 14 here
  if (shift > 24u) return {sign};
  const uint32_t significand = (magnitude & 0x007fffffu) | 0x00800000u;
  uint32_t units = significand >> shift;
  const uint32_t remainder = significand & ((1u << shift) - 1u);
  const uint32_t halfway = 1u << (shift - 1u);
  if (remainder > halfway || (remainder == halfway && (units & 1u) != 0)) ++units;
  return {static_cast<uint16_t>(sign | units)};
}
inline float to_float(float16 value) {
  const uint32_t sign = static_cast<uint32_t>(value.bits & 0x8000u) << 16;
  const uint32_t exponent = (value.bits >> 10) & 0x1fu;
  const uint32_t mantissa = value.bits & 0x03ffu;
  if (exponent == 0) {  // zero or subnormal: mantissa · 2^-24, exact in fp32
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    return sign != 0 ? -magnitude : magnitude;
  }
  if (exponent == 0x1fu) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  return std::bit_cast<float>(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

// The ElementType of a host element type: float, double, int32_t, bfloat16, float16.
template <typename T>
constexpr ElementType element_type_of();
template <>
constexpr ElementType element_type_of<float>() { return ElementType::f32; }
template <>
constexpr ElementType element_type_of<double>() { return ElementType::f64; }
template <>
constexpr ElementType element_type_of<int32_t>() { return ElementType::i32; }
template <>
constexpr ElementType element_type_of<uint64_t>() {
  return ElementType::u64;
}
template <>
constexpr ElementType element_type_of<bfloat16>() {
  return ElementType::bf16;
}
template <>
constexpr ElementType element_type_of<float16>() { return ElementType::f16; }

}  // namespace backend
