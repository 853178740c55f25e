// PinnedUploadRing (pinned_upload_ring.hpp): slots taken round-robin, each rewritten after
// waiting for the mark of its last copy.
#include "backend/device/pinned_upload_ring.hpp"

#include <cstring>

#include "backend/common/error.hpp"

namespace backend {

PinnedUploadRing::PinnedUploadRing(Device& device, int64_t slots, int64_t slot_bytes,
                                   std::string_view what)
    : device_(&device), what_(what), slot_bytes_(slot_bytes) {
  if (slots < 1 || slot_bytes < 0) {
    common::fail("{}: {} slots of {} bytes; at least one slot of 0 or more bytes", what, slots,
                 slot_bytes);
  }
  marks_.resize(static_cast<size_t>(slots));
  memory_ = device.allocate_pinned_host(slots * slot_bytes, what);
}

void PinnedUploadRing::upload(View destination, const void* source) {
  const int64_t bytes = destination.bytes();
  if (bytes == 0) return;
  if (device_ == nullptr || bytes > slot_bytes_) {
    common::fail("{}: an upload of {} bytes, larger than its slots of {} bytes", what_, bytes,
                 slot_bytes_);
  }
  DeviceMark& mark = marks_[static_cast<size_t>(next_)];
  std::byte* slot = static_cast<std::byte*>(memory_.data()) + next_ * slot_bytes_;
  next_ = (next_ + 1) % slots();
  device_->wait_for(mark);
  std::memcpy(slot, source, static_cast<size_t>(bytes));
  device_->copy_from_host(destination, slot);
  mark = device_->mark();
}

}  // namespace backend
