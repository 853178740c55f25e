// PinnedUploadRing: each upload copies from the ring's page-locked memory, never from the
// caller's, and a slot is written again only after waiting for the mark made after its last
// copy; the bytes arrive; an upload larger than a slot is refused naming the ring.
#include "backend/device/pinned_upload_ring.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "backend/common/error.hpp"
#include "backend/device/arena.hpp"
#include "backend/device/cpu_device.hpp"

using backend::CpuDevice;
using backend::DeviceMark;
using backend::DeviceMemory;
using backend::ElementType;
using backend::PinnedUploadRing;
using backend::View;

namespace {

// The CPU device, writing down the calls a ring makes: which pinned slot each copy read and
// the marks made and waited for.
class RecordingDevice final : public CpuDevice {
 public:
  std::vector<std::string> calls;
  const std::byte* pinned = nullptr;
  int64_t pinned_bytes = 0;
  int64_t slot_bytes = 1;

  DeviceMemory allocate_pinned_host(int64_t bytes, std::string_view what) override {
    DeviceMemory memory = CpuDevice::allocate_pinned_host(bytes, what);
    pinned = static_cast<const std::byte*>(memory.data());
    pinned_bytes = bytes;
    return memory;
  }
  void copy_from_host(View destination, const void* source) override {
    const auto* from = static_cast<const std::byte*>(source);
    if (from >= pinned && from < pinned + pinned_bytes) {
      calls.push_back("copy from slot " + std::to_string((from - pinned) / slot_bytes));
    } else {
      calls.push_back("copy from elsewhere");
    }
    CpuDevice::copy_from_host(destination, source);
  }
  DeviceMark mark() override {
    const DeviceMark made = CpuDevice::mark();
    calls.push_back("mark " + std::to_string(made.sequence));
    return made;
  }
  // Also what the slot the mark's copy read holds at the wait (the ring's slots are taken in
  // turn, so mark n's copy read slot (n - 1) % slots): still that copy's values, which the
  // ring may overwrite only after the wait.
  void wait_for(DeviceMark mark) override {
    if (mark.sequence == 0) return;
    const auto slot = static_cast<int64_t>((mark.sequence - 1) % (pinned_bytes / slot_bytes));
    int32_t first = 0;
    std::memcpy(&first, pinned + slot * slot_bytes, sizeof first);
    calls.push_back("wait for " + std::to_string(mark.sequence) + " (slot " + std::to_string(slot) +
                    " holds " + std::to_string(first) + ")");
  }
};

}  // namespace

TEST_CASE("a pinned upload ring reuses a slot only after the mark of its last copy") {
  RecordingDevice device;
  device.slot_bytes = 4 * sizeof(int32_t);
  backend::ArenaLayout layout;
  std::vector<int64_t> regions;
  for (int k = 0; k < 5; ++k) regions.push_back(layout.add("tokens", ElementType::i32, 4));
  const backend::Arena arena(device, layout, "destinations");
  PinnedUploadRing ring(device, 2, device.slot_bytes, "the test's slots");
  CHECK(ring.slots() == 2);
  for (int k = 0; k < 5; ++k) {
    std::vector<int32_t> source = {k, k + 10, k + 20, k + 30};
    ring.upload(arena.view(regions[k]), source.data());
    source.assign(4, -1);  // free to reuse at once
  }
  CHECK(device.calls ==
        std::vector<std::string>{"copy from slot 0", "mark 1",                                 //
                                 "copy from slot 1", "mark 2",                                 //
                                 "wait for 1 (slot 0 holds 0)", "copy from slot 0", "mark 3",  //
                                 "wait for 2 (slot 1 holds 1)", "copy from slot 1", "mark 4",  //
                                 "wait for 3 (slot 0 holds 2)", "copy from slot 0", "mark 5"});
  for (int k = 0; k < 5; ++k) {
    const View view = arena.view(regions[k]);
    const auto* values = static_cast<const int32_t*>(view.data);
    CHECK(std::vector<int32_t>(values, values + 4) ==
          std::vector<int32_t>{k, k + 10, k + 20, k + 30});
  }

  // A smaller upload uses the front of its slot; an empty one queues nothing.
  device.calls.clear();
  backend::ArenaLayout small_layout;
  small_layout.add("one", ElementType::i32, 1);
  small_layout.add("none", ElementType::i32, 0);
  const backend::Arena small(device, small_layout, "small");
  const int32_t seven = 7;
  ring.upload(small.view(0), &seven);
  ring.upload(small.view(1), &seven);
  CHECK(device.calls ==
        std::vector<std::string>{"wait for 4 (slot 1 holds 3)", "copy from slot 1", "mark 6"});
  CHECK(*static_cast<const int32_t*>(small.view(0).data) == 7);
}

TEST_CASE("a pinned upload ring refuses an upload larger than its slots, naming them") {
  CpuDevice device;
  backend::ArenaLayout layout;
  layout.add("labels", ElementType::i32, 5);
  const backend::Arena arena(device, layout, "destination");
  PinnedUploadRing ring(device, 3, 4 * sizeof(int32_t), "the micro batches' upload slots");
  const std::vector<int32_t> labels(5, 1);
  CHECK_THROWS_WITH_AS(ring.upload(arena.view(0), labels.data()),
                       "the micro batches' upload slots: an upload of 20 bytes, larger than its "
                       "slots of 16 bytes",
                       common::Error);
  CHECK_THROWS_WITH_AS(PinnedUploadRing(device, 0, 16, "no slots"),
                       "no slots: 0 slots of 16 bytes; at least one slot of 0 or more bytes",
                       common::Error);
  PinnedUploadRing unmade;
  CHECK_THROWS_AS(unmade.upload(arena.view(0), labels.data()), common::Error);
}

TEST_CASE("marks of the CPU device count up and waiting for one returns at once") {
  CpuDevice device;
  const DeviceMark first = device.mark();
  const DeviceMark second = device.mark();
  CHECK(first.sequence == 1);
  CHECK(second.sequence == 2);
  device.wait_for(first);
  device.wait_for(DeviceMark{});
}
