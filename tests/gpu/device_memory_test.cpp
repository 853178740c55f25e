// The CUDA device's memory and reductions: copies both ways and on the device (against the CPU
// device's copy), pinned uploads through a ring of two slots behind busy work, marks,
// fill_zero, allocate_zeroed, the out-of-memory message, sum against the CPU
// device and run to run, and the refusals (fp64 or fp16 ops, host memory) naming the op.
// Skipped without a GPU (gpu_test_support.hpp).
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "backend/common/error.hpp"
#include "backend/device/pinned_upload_ring.hpp"
#include "backend/ops/gelu.hpp"
#include "backend/ops/linear.hpp"
#include "backend/ops/reduction.hpp"
#include "gpu/gpu_test_support.hpp"

using backend::ElementType;
using backend::View;
namespace ops = backend::ops;
using namespace gpu_test;

TEST_CASE("the CUDA device copies bytes both ways, zeroes and allocates zeroed memory") {
  auto gpu = open_gpu_or_skip();
  if (!gpu) return;
  CHECK(gpu->memory_kind() == backend::MemoryKind::cuda);
  MESSAGE("device: " << gpu->name());
  Tensors tensors(*gpu);
  for (int64_t count : {int64_t{1}, int64_t{7}, int64_t{100003}}) {
    const auto values = random_values(count, 11);
    View view = tensors.input(values, ElementType::f32);
    const auto back = tensors.read(view);
    INFO("count " << count);
    CHECK(std::memcmp(back.data(), values.data(), values.size() * sizeof(float)) == 0);
    gpu->fill_zero(view);
    CHECK(tensors.read(view) == std::vector<float>(static_cast<size_t>(count), 0.0f));
  }
  // allocate_zeroed: zero however the memory was used before.
  {
    Tensors scratch(*gpu);
    scratch.poisoned(1 << 20, ElementType::f32);
  }
  backend::DeviceMemory memory = gpu->allocate_zeroed(int64_t{4} << 20, "a test block");
  std::vector<float> host(static_cast<size_t>(1 << 20), 1.0f);
  gpu->copy_to_host(host.data(), View{memory.data(), 1 << 20, ElementType::f32,
                                      backend::MemoryKind::cuda});
  CHECK(host == std::vector<float>(static_cast<size_t>(1 << 20), 0.0f));
}

TEST_CASE("the CUDA device copies on the device as the CPU device does, and refuses a mismatch") {
  auto gpu = open_gpu_or_skip();
  if (!gpu) return;
  backend::CpuDevice cpu;
  for (ElementType type :
       {ElementType::f32, ElementType::bf16, ElementType::f16, ElementType::f64}) {
    for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{1000003}}) {
      const auto values = representable(random_values(count, 15), type);
      Tensors cpu_tensors(cpu), gpu_tensors(*gpu);
      View cpu_copy = cpu_tensors.poisoned(count, type);
      cpu.copy(cpu_copy, cpu_tensors.input(values, type));
      View gpu_source = gpu_tensors.input(values, type);
      View gpu_copy = gpu_tensors.poisoned(count, type);
      gpu->copy(gpu_copy, gpu_source);
      INFO("copy of " << count << " " << type_name(type));
      const auto expected = cpu_tensors.read(cpu_copy), actual = gpu_tensors.read(gpu_copy);
      REQUIRE(actual.size() == expected.size());
      CHECK(std::memcmp(actual.data(), expected.data(), actual.size() * sizeof(float)) == 0);
      gpu->copy(gpu_copy, gpu_copy);  // the same view: unchanged
      const auto again = gpu_tensors.read(gpu_copy);
      CHECK(std::memcmp(again.data(), expected.data(), again.size() * sizeof(float)) == 0);
    }
  }
  Tensors tensors(*gpu);
  View single = tensors.poisoned(8, ElementType::f32);
  CHECK_THROWS_WITH_AS(gpu->copy(single, tensors.poisoned(8, ElementType::bf16)),
                       "copy: 8 elements of bf16 into 8 elements of fp32: a copy keeps the "
                       "element type and count",
                       common::Error);
  CHECK_THROWS_WITH_AS(gpu->copy(single, tensors.poisoned(9, ElementType::f32)),
                       doctest::Contains("9 elements of fp32 into 8 elements"), common::Error);
  std::vector<float> host(8);
  const View host_view{host.data(), 8, ElementType::f32, backend::MemoryKind::host};
  CHECK_THROWS_WITH_AS(gpu->copy(single, host_view), doctest::Contains("host memory in copy"),
                       common::Error);
}

TEST_CASE("pinned uploads queued behind busy work arrive whole, and a mark waits for its point") {
  auto gpu = open_gpu_or_skip();
  if (!gpu) return;
  Tensors tensors(*gpu);
  // About 20 ms of copies on the stream, so the uploads queue far behind: a slot rewritten
  // before its copy ran would land the next upload's values.
  const int64_t big = int64_t{64} << 20;
  View from = tensors.poisoned(big, ElementType::f32);
  View to = tensors.poisoned(big, ElementType::f32);
  for (int k = 0; k < 40; ++k) gpu->copy(to, from);
  backend::PinnedUploadRing ring(*gpu, 2, 1024 * sizeof(int32_t), "the test's slots");
  std::vector<View> destinations;
  for (int k = 0; k < 64; ++k) {
    destinations.push_back(tensors.poisoned(1024, ElementType::f32));
    std::vector<int32_t> values(1024);
    for (int i = 0; i < 1024; ++i) values[static_cast<size_t>(i)] = k * 4096 + i;
    View as_ints = destinations.back();
    as_ints.type = ElementType::i32;
    ring.upload(as_ints, values.data());
  }
  for (int k = 0; k < 64; ++k) {
    CAPTURE(k);
    View as_ints = destinations[static_cast<size_t>(k)];
    as_ints.type = ElementType::i32;
    std::vector<int32_t> back(1024);
    gpu->copy_to_host(back.data(), as_ints);
    CHECK(back.front() == k * 4096);
    CHECK(back.back() == k * 4096 + 1023);
  }
  for (int k = 0; k < 40; ++k) gpu->copy(to, from);
  const backend::DeviceMark mark = gpu->mark();
  gpu->wait_for(mark);
  gpu->wait_for(backend::DeviceMark{});
  CHECK_THROWS_WITH_AS(gpu->wait_for(backend::DeviceMark{mark.sequence + 1}),
                       doctest::Contains("was never made"), common::Error);
}

TEST_CASE("the CUDA device names what it could not allocate, with the free memory") {
  auto gpu = open_gpu_or_skip();
  if (!gpu) return;
  CHECK_THROWS_WITH_AS(gpu->allocate_zeroed(int64_t{1} << 50, "the test's huge block"),
                       doctest::Contains("the test's huge block"), common::Error);
  CHECK_THROWS_WITH_AS(gpu->allocate_zeroed(int64_t{1} << 50, "the test's huge block"),
                       doctest::Contains("free"), common::Error);
  // The device still works afterwards.
  Tensors tensors(*gpu);
  View view = tensors.input({1.0f, 2.0f}, ElementType::f32);
  CHECK(tensors.read(view) == std::vector<float>{1.0f, 2.0f});
}

TEST_CASE("the CUDA device's sum matches the CPU device's and is the same bits run after run") {
  auto gpu = open_gpu_or_skip();
  if (!gpu) return;
  backend::CpuDevice cpu;
  for (ElementType type :
       {ElementType::f32, ElementType::bf16, ElementType::f16, ElementType::f64}) {
    for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{129}, int64_t{1000003}}) {
      const auto values = representable(random_values(count, 12), type);
      Tensors cpu_tensors(cpu), gpu_tensors(*gpu);
      // The CPU reference sums the same values as fp32 (exact for bf16 and fp16 inputs), or fp64.
      const ElementType reference_type = type == ElementType::f64 ? type : ElementType::f32;
      View cpu_total = cpu_tensors.poisoned(1, ElementType::f64);
      ops::sum(cpu, cpu_total, cpu_tensors.input(values, reference_type));
      View gpu_values = gpu_tensors.input(values, type);
      View gpu_total = gpu_tensors.poisoned(1, ElementType::f64);
      ops::sum(*gpu, gpu_total, gpu_values);
      const double expected = cpu_tensors.read_f64(cpu_total);
      const double first = gpu_tensors.read_f64(gpu_total);
      ops::sum(*gpu, gpu_total, gpu_values);
      const double second = gpu_tensors.read_f64(gpu_total);
      INFO("sum of " << count << " " << type_name(type) << ": got " << first << ", expected "
                     << expected);
      CHECK(std::abs(first - expected) <= 1e-12 * std::max(1.0, std::abs(expected)) * count);
      CHECK(std::memcmp(&first, &second, sizeof(double)) == 0);
    }
  }
}

TEST_CASE("the CUDA device refuses fp64 and fp16 ops and host memory, naming the op") {
  auto gpu = open_gpu_or_skip();
  if (!gpu) return;
  Tensors tensors(*gpu);
  const auto values = random_values(7 * 13, 13);
  View x = tensors.input(values, ElementType::f64);
  View w = tensors.input(random_values(5 * 13, 14), ElementType::f64);
  View y = tensors.poisoned(7 * 5, ElementType::f64);
  CHECK_THROWS_WITH_AS(
      ops::linear_forward(*gpu, y, x, w, tensors.empty(ElementType::f64), 7, 13, 5),
      doctest::Contains("linear_forward"), common::Error);
  CHECK_THROWS_WITH_AS(ops::gelu_forward(*gpu, View{y.data, y.numel, ElementType::f16, y.on},
                                         View{x.data, x.numel, ElementType::f16, x.on}),
                       doctest::Contains("fp16"), common::Error);
  std::vector<float> host(7 * 13);
  const View host_view{host.data(), static_cast<int64_t>(host.size()), ElementType::f32,
                       backend::MemoryKind::host};
  CHECK_THROWS_WITH_AS(gpu->fill_zero(host_view), doctest::Contains("host memory"),
                       common::Error);
  CHECK_THROWS_WITH_AS(
      ops::linear_forward(*gpu, tensors.poisoned(7 * 5, ElementType::f32), host_view,
                          tensors.input(random_values(5 * 13, 14), ElementType::f32),
                          tensors.empty(ElementType::f32), 7, 13, 5),
      doctest::Contains("host memory"), common::Error);
}
