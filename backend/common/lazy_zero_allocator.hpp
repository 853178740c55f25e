// An allocator for the big zero-initialised buffers (parameters, gradients, optimizer state,
// activations): std::vector<T, LazyZeroAllocator<T>>(n) holds n zeros like std::vector<T>(n),
// without the pass that writes them. The memory comes from std::calloc, which for blocks of
// this size maps fresh pages that the kernel hands out already zeroed on first touch (glibc
// skips the memset for mmap-ed blocks), and construct() default-initialises, a no-op for
// arithmetic T. A 126M-parameter model spent about a second writing zeros into buffers that
// were then overwritten (parameters) or zeroed again (gradients); now the pages are zeroed by
// the kernel when first written, by whichever thread writes them (first touch in parallel).
// Only for trivially constructible T: a zero bit pattern must be the value zero. Only a fresh
// allocation is zeros: resize() growing back into capacity an earlier shrink left keeps the
// old values there (std::vector's allocator would write zeros), so resize such a vector by
// replacing it with a new one.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <new>
#include <type_traits>
#include <utility>

namespace common {

template <typename T>
struct LazyZeroAllocator {
  static_assert(std::is_trivially_default_constructible_v<T> && std::is_trivially_destructible_v<T>,
                "LazyZeroAllocator is for plain numbers, whose zero is all-zero bits");
  using value_type = T;

  LazyZeroAllocator() = default;
  template <typename U>
  LazyZeroAllocator(const LazyZeroAllocator<U>&) noexcept {}

  T* allocate(std::size_t count) {
    if (count == 0) return nullptr;
    void* memory = std::calloc(count, sizeof(T));
    if (memory == nullptr) throw std::bad_alloc();
    return static_cast<T*>(memory);
  }
  void deallocate(T* pointer, std::size_t) noexcept { std::free(pointer); }

  // vector(n) and resize(n) construct with no arguments: leave calloc's zeros in place.
  template <typename U>
  void construct(U* pointer) noexcept {
    ::new (static_cast<void*>(pointer)) U;
  }
  template <typename U, typename... Arguments>
  void construct(U* pointer, Arguments&&... arguments) {
    ::new (static_cast<void*>(pointer)) U(std::forward<Arguments>(arguments)...);
  }

  template <typename U>
  bool operator==(const LazyZeroAllocator<U>&) const noexcept {
    return true;
  }
};

}  // namespace common
