// Device's defaults: a device that does not override capture cannot capture (device.hpp).
#include "backend/device/device.hpp"

#include "backend/common/error.hpp"

namespace backend {

void Device::begin_capture() {
  common::fail(
      "{} cannot capture its work into a graph (CUDA graphs are a CUDA device's, the "
      "recording a CpuDevice's)",
      name());
}

std::unique_ptr<DeviceGraph> Device::end_capture() {
  common::fail("end_capture on {}, which cannot capture", name());
}

void Device::refuse_in_capture(std::string_view call) const {
  if (capturing()) {
    common::fail(
        "{} on {} inside a capture: captured work neither reads nor writes the "
        "device's memory from the host, waits for it nor allocates (a step's inputs are "
        "uploaded before its replay, its results read after it)",
        call, name());
  }
}

}  // namespace backend
