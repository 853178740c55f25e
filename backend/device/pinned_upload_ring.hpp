// PinnedUploadRing: host data uploaded to a device through page-locked staging slots taken in
// turn, so that the upload only queues a copy. From ordinary (pageable) memory CUDA stages the
// bytes itself and may first wait for the stream to drain (the CUDA runtime's "API
// synchronization behavior"): each micro batch's tokens and labels would then hold the host
// until the GPU had finished the micro batch before, the host wait docs/step_on_device.md
// (item 4) removes. A slot is written again only once the device has finished the copy that
// last read it (Device::mark after each copy, Device::wait_for before the rewrite), so the host
// waits only when it is `slots` uploads ahead of the device. On the CPU the slots are ordinary
// memory and the copies plain ones: the same code path, which the CPU tests run.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "backend/core/view.hpp"
#include "backend/device/device.hpp"
#include "backend/device/device_memory.hpp"

namespace backend {

class PinnedUploadRing {
 public:
  PinnedUploadRing() = default;
  // `slots` slots of `slot_bytes` each, allocated at once (Device::allocate_pinned_host);
  // `what` names them in an out-of-memory error and in the error of an upload too large.
  PinnedUploadRing(Device& device, int64_t slots, int64_t slot_bytes, std::string_view what);

  // destination = the destination.bytes() bytes at `source`, in the device's order of work.
  // Returns with `source` free to reuse and the copy queued. common::Error for a destination
  // larger than a slot.
  void upload(View destination, const void* source);

  int64_t slots() const { return std::ssize(marks_); }
  int64_t slot_bytes() const { return slot_bytes_; }

 private:
  Device* device_ = nullptr;
  std::string what_;
  DeviceMemory memory_;
  int64_t slot_bytes_ = 0;
  std::vector<DeviceMark> marks_;  // per slot: after the copy that last read it
  int64_t next_ = 0;
};

}  // namespace backend
