// View: a typed, non-owning window on device memory (host or a GPU's): pointer, element count,
// element type and where it lives. The model and the ops speak in views, so one
// composition serves every device and precision (docs/device.md). A view owns
// nothing: memory comes from an Arena carved at setup, which outlives its views.
//
// An empty view (data == nullptr, numel == 0) is an absent tensor, e.g. a bias the
// configuration leaves out; ops take it where the CPU twins take a nullptr.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <type_traits>

#include "backend/core/element_type.hpp"

namespace backend {

enum class MemoryKind : uint8_t { host, cuda };

struct View {
  void* data = nullptr;
  int64_t numel = 0;
  ElementType type = ElementType::f32;
  MemoryKind on = MemoryKind::host;

  bool empty() const { return data == nullptr; }
  int64_t bytes() const { return numel * element_size(type); }

  // Elements [offset, offset + count), checked against this view (common::Error).
  View slice(int64_t offset, int64_t count) const;
  // Elements [offset, numel).
  View tail(int64_t offset) const { return slice(offset, numel - offset); }

  // The elements as T*, which must be this view's type (common::Error otherwise); nullptr for
  // an empty view. Only host code that knows the memory is its own dereferences the result.
  template <typename T>
  T* as() const {
    check_type(element_type_of<T>());
    return static_cast<T*>(data);
  }

 private:
  void check_type(ElementType expected) const;
};

// The view's data, whatever its type, which must be host memory (or empty: nullptr); else
// common::Error: "the CPU device was given GPU memory" with the view's extent. The CPU device's
// copies and the ops' CPU twins read views through it.
void* host_bytes(View view);

// common::Error unless the view is GPU memory (or empty): "the CUDA device was given host
// memory in <op>" with the view's extent. The CUDA device's copies and the ops' CUDA twins
// check their views with it.
void check_on_gpu(View view, std::string_view op);

// A copy's views (Device::copy): the same element type and element count, else common::Error
// naming the op and both views' counts and types.
void check_same_extent(View destination, View source, std::string_view op);
// A conversion's views (ops::convert): bf16 or fp16 from f32 or back, one element count, else
// common::Error naming the op and both views.
void check_convertible(View destination, View source, std::string_view op);

// Host memory the caller owns (a vector, a scalar's span of one) as a view of its element type:
// what the optimizer's host form and the collectives over host values take. A span of const
// elements is viewed as read-only by convention; the view type itself has no const.
template <typename T>
View host_view(std::span<T> values) {
  using Element = std::remove_const_t<T>;
  return View{const_cast<Element*>(values.data()), static_cast<int64_t>(values.size()),
              element_type_of<Element>(), MemoryKind::host};
}

}  // namespace backend
