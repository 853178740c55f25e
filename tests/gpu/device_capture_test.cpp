// Capture on the CUDA device (a stream capture instantiated into a CUDA graph): a replay runs
// the captured ops again with the arguments of the capture and the memory's contents of the
// replay, the same bits as the same ops queued one by one; AdamW's update captured once and
// replayed after each step's staging gives the eager steps' bits, bf16 working copy included;
// what a capture cannot hold is refused naming the call, and the device works after an
// abandoned capture. With GPU_TESTS_ON_CPU=1 the CPU device's recording stands in.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "backend/common/error.hpp"
#include "backend/ops/reduction.hpp"
#include "backend/ops/step_scalars.hpp"
#include "backend/optim/adamw.hpp"
#include "gpu/gpu_test_support.hpp"

using backend::ElementType;
using backend::View;
namespace ops = backend::ops;
using namespace gpu_test;

namespace {

// accumulated += Σ (values · 0.5)² through a device copy, a fill, a scale, a sum of squares
// and an add: five captured nodes at least.
void queue_scaled_square_sum(Device& device, View values, View copied, View total,
                             View accumulated) {
  device.copy(copied, values);
  device.fill_zero(total);
  ops::scale(device, copied, 0.5);
  ops::sum_of_squares(device, total, copied);
  ops::add(device, accumulated, total);
}

double read_double(Device& device, View value) {
  double host = 0;
  device.copy_to_host(&host, value);
  return host;
}

}  // namespace

TEST_CASE("a graph captured on the CUDA device replays its ops as queuing them again would") {
  auto gpu = open_gpu_or_skip(/*cpu_stand_in_allowed=*/true);
  if (!gpu) return;
  const int64_t count = 1000003;
  const auto first = random_values(count, 51), second = random_values(count, 52);
  Tensors t(*gpu);
  View values = t.input(first, ElementType::f32), copied = t.poisoned(count, ElementType::f32);
  View total = t.input({0.0f}, ElementType::f64), accumulated = t.input({0.0f}, ElementType::f64);
  // Eager: the first values twice, then the second once.
  queue_scaled_square_sum(*gpu, values, copied, total, accumulated);
  queue_scaled_square_sum(*gpu, values, copied, total, accumulated);
  const double eager_two = read_double(*gpu, accumulated);
  gpu->copy_from_host(values, second.data());
  queue_scaled_square_sum(*gpu, values, copied, total, accumulated);
  const double eager_three = read_double(*gpu, accumulated);
  // Captured once, replayed: the same sums, the new input read at the third replay.
  gpu->fill_zero(accumulated);
  gpu->copy_from_host(values, first.data());
  gpu->begin_capture();
  queue_scaled_square_sum(*gpu, values, copied, total, accumulated);
  const std::unique_ptr<backend::DeviceGraph> graph = gpu->end_capture();
  MESSAGE("captured nodes: " << graph->nodes());
  CHECK(graph->nodes() >= 5);
  CHECK(read_double(*gpu, accumulated) == 0.0);
  graph->replay();
  graph->replay();
  CHECK(read_double(*gpu, accumulated) == eager_two);
  gpu->copy_from_host(values, second.data());
  graph->replay();
  CHECK(read_double(*gpu, accumulated) == eager_three);
}

TEST_CASE("AdamW's update captured on the CUDA device and replayed after each staging is eager's") {
  auto gpu = open_gpu_or_skip(/*cpu_stand_in_allowed=*/true);
  if (!gpu) return;
  const bool on_gpu = gpu->memory_kind() == backend::MemoryKind::cuda;
  const int64_t count = 300007;
  const auto start = random_values(count, 61, 0.5f);
  const auto gradients = random_values(count, 62, 1e-2f);
  const std::vector<backend::ParameterGroup> groups = {{0, 200000, true}, {200000, 100007, false}};
  const backend::AdamWConfig config{.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
  Tensors t(*gpu);
  backend::AdamW eager(config, groups, count, *gpu), captured(config, groups, count, *gpu);
  View eager_master = t.input(start, ElementType::f32);
  View captured_master = t.input(start, ElementType::f32);
  // The bf16 working copy written in the same pass (a GPU's mixed precision only).
  View eager_weights = on_gpu ? t.poisoned(count, ElementType::bf16) : View{};
  View captured_weights = on_gpu ? t.poisoned(count, ElementType::bf16) : View{};
  const View g = t.input(gradients, ElementType::f32);
  std::unique_ptr<backend::DeviceGraph> update;
  for (int step = 0; step < 6; ++step) {
    const double lr = 3e-4 * (step + 1);
    const double weight_decay = 0.1 - 0.01 * step;
    eager.step(eager_master, eager_weights, g, lr, weight_decay);
    captured.stage_step(lr, weight_decay);
    if (step == 0) {
      captured.queue_step(captured_master, captured_weights, g);
    } else {
      if (step == 1) {
        gpu->begin_capture();
        captured.queue_step(captured_master, captured_weights, g);
        update = gpu->end_capture();
      }
      update->replay();
    }
    CAPTURE(step);
    expect_identical("the replayed update's master weights", t.read(captured_master),
                     t.read(eager_master));
    if (on_gpu) {
      expect_identical("the replayed update's bf16 working copy", t.read(captured_weights),
                       t.read(eager_weights));
    }
  }
}

TEST_CASE("inside a capture the CUDA device refuses host copies, waits and allocations by name") {
  auto gpu = open_gpu_or_skip();
  if (!gpu) return;
  Tensors t(*gpu);
  View values = t.input(random_values(1024, 71), ElementType::f32);
  std::vector<float> host(1024);
  gpu->begin_capture();
  CHECK(gpu->capturing());
  CHECK_THROWS_WITH_AS(gpu->copy_from_host(values, host.data()),
                       doctest::Contains("copy_from_host on cuda:0"), common::Error);
  CHECK_THROWS_WITH_AS(gpu->copy_to_host(host.data(), values),
                       doctest::Contains("copy_to_host on cuda:0"), common::Error);
  CHECK_THROWS_WITH_AS(gpu->synchronize(), doctest::Contains("synchronize on cuda:0"),
                       common::Error);
  CHECK_THROWS_WITH_AS((void)gpu->mark(), doctest::Contains("mark on cuda:0"), common::Error);
  CHECK_THROWS_WITH_AS((void)gpu->allocate_zeroed(64, "more"),
                       doctest::Contains("allocate_zeroed on cuda:0"), common::Error);
  ops::scale(*gpu, values, 2.0);
  gpu->abandon_capture();
  CHECK_FALSE(gpu->capturing());
  // The abandoned scale never ran, and the device queues and reads as before.
  gpu->copy_from_host(values, std::vector<float>(1024, 3.0f).data());
  ops::scale(*gpu, values, 2.0);
  CHECK(t.read(values) == std::vector<float>(1024, 6.0f));
}
