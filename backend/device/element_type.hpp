// The element types device memory holds, as a runtime value: the model picks its precision
// at run time (--bf16, --fp16, fp32 by default), so a buffer's type travels with it in a View
// rather than in a template parameter. i32 is for token and label ids. (Not `DType`: that is
// the .idx files' element code in data/indexed_dataset.hpp, Megatron's name for it.)
#pragma once

#include <bit>
#include <cstdint>
#include <string_view>

namespace backend {

enum class ElementType : uint8_t { f32, f64, bf16, f16, i32 };

constexpr int64_t element_size(ElementType dtype) {
  switch (dtype) {
    case ElementType::f64: return 8;
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
constexpr ElementType element_type_of<bfloat16>() { return ElementType::bf16; }
template <>
constexpr ElementType element_type_of<float16>() { return ElementType::f16; }

}  // namespace backend
