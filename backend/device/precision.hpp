// Precision: the element types of the model's weights (the working copy the forward reads),
// activations and parameter gradients, as Megatron's --bf16 / --fp16 / fp32 choose them.
// Master weights and AdamW moments are fp32 under every precision (Megatron's mixed-precision
// optimizer), and checkpoints hold those, so the file format does not depend on it. fp64 is
// the CPU reference the gradient checks use.
#pragma once

#include <string>

#include "backend/device/element_type.hpp"

namespace backend {

struct Precision {
  ElementType weights = ElementType::f32;
  ElementType activations = ElementType::f32;
  ElementType gradients = ElementType::f32;

  // Every buffer of one type: fp32 (Megatron's default) or fp64.
  static constexpr Precision uniform(ElementType dtype) { return {dtype, dtype, dtype}; }

  bool operator==(const Precision&) const = default;
  std::string name() const;  // "fp32", or "bf16 weights and activations, fp32 gradients"
};

}  // namespace backend
