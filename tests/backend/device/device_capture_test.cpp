// CpuDevice's capture (device.hpp): the ops and the device's copies and fills are recorded, not
// run; each replay runs them with the arguments they had at capture and the memory's contents at
// replay (what a CUDA graph keeps); what a capture cannot hold is refused naming the call, and a
// capture abandoned after a refusal leaves the device running ops eagerly again.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "backend/common/error.hpp"
#include "backend/device/arena.hpp"
#include "backend/device/cpu_device.hpp"
#include "backend/ops/reduction.hpp"
#include "backend/ops/step_scalars.hpp"

using backend::CpuDevice;
using backend::ElementType;
using backend::View;
namespace ops = backend::ops;

namespace {

// Device memory for the test: `values` (f32, count), a copy of them, one f64 total and one
// f64 accumulator.
struct CaptureBuffers {
  explicit CaptureBuffers(CpuDevice& device, int64_t count)
      : memory(device.allocate_zeroed(count * 8 + 64, "the capture test's buffers")) {
    auto* base = static_cast<std::byte*>(memory.data());
    values = {base, count, ElementType::f32, backend::MemoryKind::host};
    copied = {base + count * 4, count, ElementType::f32, backend::MemoryKind::host};
    total = {base + count * 8, 1, ElementType::f64, backend::MemoryKind::host};
    accumulated = {base + count * 8 + 8, 1, ElementType::f64, backend::MemoryKind::host};
  }
  float* value_data() { return values.as<float>(); }
  double accumulated_value() { return *accumulated.as<double>(); }

  backend::DeviceMemory memory;
  View values, copied, total, accumulated;
};

// accumulated += Σ values · factor, through a copy, a fill, a scale, a sum and an add.
void queue_scaled_sum(CpuDevice& device, CaptureBuffers& buffers, double factor) {
  device.copy(buffers.copied, buffers.values);
  device.fill_zero(buffers.total);
  ops::scale(device, buffers.copied, factor);
  ops::sum(device, buffers.total, buffers.copied);
  ops::add(device, buffers.accumulated, buffers.total);
}

}  // namespace

TEST_CASE("a captured sequence runs only when replayed, with the arguments it was captured with") {
  CpuDevice device;
  CaptureBuffers buffers(device, 1000);
  for (int i = 0; i < 1000; ++i) buffers.value_data()[i] = static_cast<float>(i % 7);
  double factor = 2.0;  // Σ (i mod 7) over 1000 = 2997, so each run adds 5994
  device.begin_capture();
  CHECK(device.capturing());
  queue_scaled_sum(device, buffers, factor);
  std::unique_ptr<backend::DeviceGraph> graph = device.end_capture();
  CHECK_FALSE(device.capturing());
  CHECK(graph->nodes() == 5);
  CHECK(buffers.accumulated_value() == 0.0);  // recorded, not run
  // A later value of the argument is not the captured one: the graph keeps 2.
  factor = 3.0;
  graph->replay();
  CHECK(buffers.accumulated_value() == 5994.0);
  graph->replay();
  CHECK(buffers.accumulated_value() == 2 * 5994.0);
  // The memory's contents are read at replay: new inputs written between replays count.
  for (int i = 0; i < 1000; ++i) buffers.value_data()[i] = 1.0f;
  graph->replay();
  CHECK(buffers.accumulated_value() == 2 * 5994.0 + 2000.0);
  // Eager again after the capture, with today's argument.
  queue_scaled_sum(device, buffers, factor);
  CHECK(buffers.accumulated_value() == 2 * 5994.0 + 2000.0 + 3000.0);
}

TEST_CASE(
    "inside a capture the host neither reads, writes, waits for nor allocates device memory") {
  CpuDevice device;
  CaptureBuffers buffers(device, 16);
  std::vector<float> host(16, 1.0f);
  device.begin_capture();
  const auto refused = [&](const char* call, auto&& action) {
    CAPTURE(call);
    const std::string expected = std::string(call) + " on cpu inside a capture";
    CHECK_THROWS_WITH_AS(action(), doctest::Contains(expected.c_str()), common::Error);
    CHECK(device.capturing());
  };
  refused("copy_from_host", [&] { device.copy_from_host(buffers.values, host.data()); });
  refused("copy_to_host", [&] { device.copy_to_host(host.data(), buffers.values); });
  refused("queue_copy_to_host", [&] { device.queue_copy_to_host(host.data(), buffers.values); });
  refused("synchronize", [&] { device.synchronize(); });
  refused("mark", [&] { (void)device.mark(); });
  refused("wait_for", [&] { device.wait_for(backend::DeviceMark{}); });
  refused("allocate_zeroed", [&] { (void)device.allocate_zeroed(64, "more"); });
  refused("allocate_pinned_host", [&] { (void)device.allocate_pinned_host(64, "more"); });
  CHECK_THROWS_WITH_AS(device.begin_capture(), doctest::Contains("capturing already"),
                       common::Error);
  // Abandoned: nothing recorded runs, and ops run at once again.
  ops::scale(device, buffers.values, 5.0);
  device.abandon_capture();
  CHECK_FALSE(device.capturing());
  CHECK_THROWS_WITH_AS(device.end_capture(), doctest::Contains("not capturing"), common::Error);
  device.copy_from_host(buffers.values, host.data());
  ops::scale(device, buffers.values, 4.0);
  device.copy_to_host(host.data(), buffers.values);
  CHECK(host == std::vector<float>(16, 4.0f));
}
