// ops::convert on the CPU device: fp32 → bf16 and fp16 (element_type.hpp's rounding, which
// tests/backend/core checks value by value) and back, exactly, for every 16-bit pattern; the
// pairs it refuses. tests/gpu/ops_test.cpp holds the CUDA twin to these bits.
#include "backend/ops/convert.hpp"

#include <doctest/doctest.h>

#include <bit>
#include <cstdint>
#include <vector>

#include "backend/common/error.hpp"
#include "backend/device/cpu_device.hpp"

using backend::ElementType;
using backend::MemoryKind;
using backend::View;

namespace {

template <typename T>
View host_of(std::vector<T>& values, ElementType type) {
  return View{values.data(), static_cast<int64_t>(values.size()), type, MemoryKind::host};
}

}  // namespace

TEST_CASE("convert widens every bf16 and fp16 value to fp32 exactly, and rounds it back the same") {
  backend::CpuDevice device;
  std::vector<uint16_t> every(65536);
  for (size_t i = 0; i < every.size(); ++i) every[i] = static_cast<uint16_t>(i);
  for (const ElementType type : {ElementType::bf16, ElementType::f16}) {
    CAPTURE(backend::element_name(type));
    std::vector<float> wide(every.size());
    backend::ops::convert(device, host_of(wide, ElementType::f32), host_of(every, type));
    std::vector<uint16_t> back(every.size());
    backend::ops::convert(device, host_of(back, type), host_of(wide, ElementType::f32));
    int64_t wrong_value = 0, wrong_round_trip = 0;
    for (size_t i = 0; i < every.size(); ++i) {
      const float expected = type == ElementType::bf16
                                 ? backend::to_float(backend::bfloat16{every[i]})
                                 : backend::to_float(backend::float16{every[i]});
      const bool nan = expected != expected;
      if (std::bit_cast<uint32_t>(wide[i]) != std::bit_cast<uint32_t>(expected)) ++wrong_value;
      // A NaN may come back quieted; every other value comes back as it was.
      if (!nan && back[i] != every[i]) ++wrong_round_trip;
    }
    CHECK(wrong_value == 0);
    CHECK(wrong_round_trip == 0);
  }
}

TEST_CASE("convert refuses pairs other than fp32 to and from bf16 or fp16, and unequal counts") {
  backend::CpuDevice device;
  std::vector<float> single(4);
  std::vector<double> twice(4);
  std::vector<uint16_t> half(4), shorter(3);
  const auto refused = "a conversion makes bf16 or fp16 from fp32, or fp32 from bf16 or fp16";
  CHECK_THROWS_WITH_AS(backend::ops::convert(device, host_of(single, ElementType::f32),
                                             host_of(single, ElementType::f32)),
                       doctest::Contains(refused), common::Error);
  CHECK_THROWS_WITH_AS(backend::ops::convert(device, host_of(half, ElementType::bf16),
                                             host_of(twice, ElementType::f64)),
                       doctest::Contains(refused), common::Error);
  CHECK_THROWS_WITH_AS(backend::ops::convert(device, host_of(half, ElementType::bf16),
                                             host_of(half, ElementType::f16)),
                       doctest::Contains(refused), common::Error);
  CHECK_THROWS_WITH_AS(backend::ops::convert(device, host_of(single, ElementType::f32),
                                             host_of(shorter, ElementType::bf16)),
                       doctest::Contains("convert: 3 elements of bf16 into 4 elements of fp32"),
                       common::Error);
}
