// The element types device memory holds, as a runtime value: the model picks its precision
// at run time (--bf16, --fp16, fp32 by default), so a buffer's type travels with it in a View
// rather than in a template parameter. i32 is for token and label ids. (Not `DType`: that is
// the .idx files' element code in data/indexed_dataset.hpp, Megatron's name for it.)
#pragma once

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

// The ElementType of a host element type: float, double, int32_t.
template <typename T>
constexpr ElementType element_type_of();
template <>
constexpr ElementType element_type_of<float>() { return ElementType::f32; }
template <>
constexpr ElementType element_type_of<double>() { return ElementType::f64; }
template <>
constexpr ElementType element_type_of<int32_t>() { return ElementType::i32; }

}  // namespace backend
