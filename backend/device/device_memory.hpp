// DeviceMemory: one block a Device allocated, released by the device's own function when the
// owner goes (munmap for host memory, cudaFree for a GPU's). Move-only.
#pragma once

#include <cstdint>
#include <utility>

#include "backend/device/view.hpp"

namespace backend {

class DeviceMemory {
 public:
  using Release = void (*)(void* data, int64_t bytes) noexcept;

  DeviceMemory() = default;
  DeviceMemory(void* data, int64_t bytes, MemoryKind on, Release release)
      : data_(data), bytes_(bytes), on_(on), release_(release) {}
  DeviceMemory(DeviceMemory&& other) noexcept { swap(other); }
  DeviceMemory& operator=(DeviceMemory&& other) noexcept {
    DeviceMemory(std::move(other)).swap(*this);
    return *this;
  }
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  ~DeviceMemory() {
    if (data_ != nullptr && release_ != nullptr) release_(data_, bytes_);
  }

  void* data() const { return data_; }
  int64_t bytes() const { return bytes_; }
  MemoryKind on() const { return on_; }

 private:
  void swap(DeviceMemory& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(bytes_, other.bytes_);
    std::swap(on_, other.on_);
    std::swap(release_, other.release_);
  }

  void* data_ = nullptr;
  int64_t bytes_ = 0;
  MemoryKind on_ = MemoryKind::host;
  Release release_ = nullptr;
};

}  // namespace backend
