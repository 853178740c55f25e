// DeviceMemory: one block a Device allocated, released by the device's own function when the
// owner goes (munmap for host memory, cudaFree for a GPU's), and counted in the device's
// MemoryLedger while it lives. Move-only.
#pragma once

#include <atomic>
#include <cstdint>
#include <utility>

#include "backend/core/view.hpp"

namespace backend {

// The bytes a device holds in live DeviceMemory blocks, now and at most so far: what Megatron's
// memory line reports (torch.cuda.memory_allocated and max_memory_allocated). Owned by the
// device; its blocks must not outlive it (they hold a pointer to it, as their release does to
// the device's context).
struct MemoryUsage {
  int64_t allocated_bytes = 0;
  int64_t peak_bytes = 0;
  int64_t allocations = 0;  // live blocks (torch's allocation.all.current)
};

class MemoryLedger {
 public:
  void add(int64_t bytes) noexcept {
    const int64_t now = allocated_.fetch_add(bytes) + bytes;
    int64_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
    blocks_.fetch_add(1);
  }
  void remove(int64_t bytes) noexcept {
    allocated_.fetch_sub(bytes);
    blocks_.fetch_sub(1);
  }
  MemoryUsage usage() const { return {allocated_.load(), peak_.load(), blocks_.load()}; }

 private:
  std::atomic<int64_t> allocated_{0};
  std::atomic<int64_t> peak_{0};
  std::atomic<int64_t> blocks_{0};
};

class DeviceMemory {
 public:
  using Release = void (*)(void* data, int64_t bytes) noexcept;

  DeviceMemory() = default;
  DeviceMemory(void* data, int64_t bytes, MemoryKind on, Release release,
               MemoryLedger* ledger = nullptr)
      : data_(data), bytes_(bytes), on_(on), release_(release), ledger_(ledger) {
    if (ledger_ != nullptr) ledger_->add(bytes_);
  }
  DeviceMemory(DeviceMemory&& other) noexcept { swap(other); }
  DeviceMemory& operator=(DeviceMemory&& other) noexcept {
    DeviceMemory(std::move(other)).swap(*this);
    return *this;
  }
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  ~DeviceMemory() {
    if (data_ != nullptr && release_ != nullptr) release_(data_, bytes_);
    if (ledger_ != nullptr) ledger_->remove(bytes_);
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
    std::swap(ledger_, other.ledger_);
  }

  void* data_ = nullptr;
  int64_t bytes_ = 0;
  MemoryKind on_ = MemoryKind::host;
  Release release_ = nullptr;
  MemoryLedger* ledger_ = nullptr;
};

}  // namespace backend
