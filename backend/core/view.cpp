// View's checks: a wrong slice or element type is a programming error in the composition,
// reported with the extents so it is found at the first run rather than as corrupt memory.
#include "backend/core/view.hpp"

#include "backend/common/error.hpp"

namespace backend {

View View::slice(int64_t offset, int64_t count) const {
  if (offset < 0 || count < 0 || offset > numel || count > numel - offset) {
    common::fail("view slice [{}, {}) is outside the view's {} {} elements", offset,
                 offset + count, numel, element_name(type));
  }
  View part = *this;
  part.data = data == nullptr ? nullptr
                              : static_cast<char*>(data) + offset * element_size(type);
  part.numel = count;
  return part;
}

void View::check_type(ElementType expected) const {
  if (expected != type) {
    common::fail("a {} view was used as {} memory", element_name(type), element_name(expected));
  }
}

void* host_bytes(View view) {
  if (!view.empty() && view.on != MemoryKind::host) {
    common::fail("the CPU device was given GPU memory ({} elements of {})", view.numel,
                 element_name(view.type));
  }
  return view.data;
}

void check_on_gpu(View view, std::string_view op) {
  if (!view.empty() && view.on != MemoryKind::cuda) {
    common::fail("the CUDA device was given host memory in {} ({} elements of {}); copy it to "
                 "the device with copy_from_host first",
                 op, view.numel, element_name(view.type));
  }
}

void check_same_extent(View destination, View source, std::string_view op) {
  if (destination.numel != source.numel || destination.type != source.type) {
    common::fail("{}: {} elements of {} into {} elements of {}: a copy keeps the element type "
                 "and count",
                 op, source.numel, element_name(source.type), destination.numel,
                 element_name(destination.type));
  }
}

void check_convertible(View destination, View source, std::string_view op) {
  auto half = [](ElementType type) {
    return type == ElementType::bf16 || type == ElementType::f16;
  };
  const bool narrowing = half(destination.type) && source.type == ElementType::f32;
  const bool widening = destination.type == ElementType::f32 && half(source.type);
  if (destination.numel != source.numel || !(narrowing || widening)) {
    common::fail(
        "{}: {} elements of {} into {} elements of {}: a conversion makes bf16 or fp16 "
        "from fp32, or fp32 from bf16 or fp16, of one element count",
        op, source.numel, element_name(source.type), destination.numel,
        element_name(destination.type));
  }
}

}  // namespace backend
