// CpuDevice: each op is its CPU twin, bit for bit, for fp32 and fp64 (the model's tests then
// cover the composition); the device refuses element types it has no kernels for and memory
// that is not its own, naming the op; sums are in a fixed order; copies keep type and count.
#include "backend/device/cpu_device.hpp"
#include "backend/ops/convert.hpp"
#include "backend/ops/embedding.hpp"
#include "backend/ops/gelu.hpp"
#include "backend/ops/reduction.hpp"
#include "backend/ops/residual.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <random>
#include <limits>
#include <vector>

#include "backend/common/error.hpp"
#include "backend/ops/layernorm.hpp"
#include "backend/ops/linear.hpp"

using backend::CpuDevice;
using backend::ElementType;
using backend::MemoryKind;
using backend::View;
namespace ops = backend::ops;

namespace {

template <typename Scalar>
std::vector<Scalar> random_values(size_t count, uint32_t seed) {
  std::mt19937 generator(seed);
  std::normal_distribution<double> normal;
  std::vector<Scalar> values(count);
  for (auto& value : values) value = static_cast<Scalar>(normal(generator));
  return values;
}

template <typename Scalar>
View view_of(std::vector<Scalar>& values) {
  return View{values.data(), static_cast<int64_t>(values.size()), backend::element_type_of<Scalar>()};
}

}  // namespace

TEST_CASE_TEMPLATE("the CPU device's linear and layernorm are the twins, bit for bit", Scalar,
                   float, double) {
  const int64_t rows = 7, in = 13, out = 5;
  auto input = random_values<Scalar>(rows * in, 1);
  auto weight = random_values<Scalar>(out * in, 2);
  auto bias = random_values<Scalar>(out, 3);
  auto doutput = random_values<Scalar>(rows * out, 4);
  CpuDevice device;

  std::vector<Scalar> expected(rows * out), actual(rows * out);
  backend::cpu::linear_forward(expected.data(), input.data(), weight.data(), bias.data(), rows, in,
                               out);
  ops::linear_forward(device, view_of(actual), view_of(input), view_of(weight), view_of(bias), rows,
                      in, out);
  CHECK(actual == expected);

  // The parameter gradients accumulate: start both from the same non-zero values.
  auto dweight_expected = random_values<Scalar>(out * in, 5), dweight_actual = dweight_expected;
  std::vector<Scalar> dinput_expected(rows * in), dinput_actual(rows * in);
  backend::cpu::linear_backward(dinput_expected.data(), dweight_expected.data(), nullptr,
                                doutput.data(), input.data(), weight.data(), rows, in, out);
  ops::linear_backward(device, view_of(dinput_actual), view_of(dweight_actual),
                       View{nullptr, 0, backend::element_type_of<Scalar>()}, view_of(doutput),
                       view_of(input), view_of(weight), rows, in, out);
  CHECK(dweight_actual == dweight_expected);
  CHECK(dinput_actual == dinput_expected);

  auto norm_weight = random_values<Scalar>(in, 6), norm_bias = random_values<Scalar>(in, 7);
  std::vector<Scalar> normed_expected(rows * in), mean_expected(rows), rstd_expected(rows);
  std::vector<Scalar> normed_actual(rows * in), mean_actual(rows), rstd_actual(rows);
  backend::cpu::layernorm_forward(normed_expected.data(), mean_expected.data(),
                                  rstd_expected.data(), input.data(), norm_weight.data(),
                                  norm_bias.data(), Scalar{0}, static_cast<Scalar>(1e-5), rows,
                                  in);
  ops::layernorm_forward(device, view_of(normed_actual), view_of(mean_actual), view_of(rstd_actual),
                         view_of(input), view_of(norm_weight), view_of(norm_bias), 0.0, 1e-5, rows,
                         in);
  CHECK(normed_actual == normed_expected);
  CHECK(rstd_actual == rstd_expected);
}

TEST_CASE("the CPU device sums in a fixed order, in double") {
  auto values = random_values<float>(100001, 8);
  double expected = 0;
  for (const float value : values) expected += static_cast<double>(value);
  double total = -1;
  CpuDevice device;
  ops::sum(device, View{&total, 1, ElementType::f64}, view_of(values));
  CHECK(total == expected);
}

TEST_CASE("the CPU device refuses bf16, mixed types and GPU memory, naming the op") {
  CpuDevice device;
  std::vector<uint16_t> half(16);
  const View bf16{half.data(), 16, ElementType::bf16};
  CHECK_THROWS_WITH_AS(ops::gelu_forward(device, bf16, bf16),
                       "the CPU device computes in fp32 or fp64; gelu_forward has no bf16 kernel "
                       "on it (bf16 and fp16 run on --device cuda)",
                       common::Error);
  std::vector<float> single(16);
  std::vector<double> twice(16);
  CHECK_THROWS_WITH_AS(
      ops::residual_forward(device, view_of(single), view_of(twice), view_of(single)),
      "a fp32 view was used as fp64 memory", common::Error);
  View on_gpu = view_of(single);
  on_gpu.on = MemoryKind::cuda;
  CHECK_THROWS_WITH_AS(ops::gelu_forward(device, view_of(single), on_gpu),
                       "the CPU device was given GPU memory (16 elements of fp32)", common::Error);
}

TEST_CASE("the CPU device counts its live allocations and their peak") {
  CpuDevice device;
  CHECK(device.memory_usage().allocated_bytes == 0);
  {
    backend::DeviceMemory first = device.allocate_zeroed(4096, "first");
    {
      backend::DeviceMemory second = device.allocate_zeroed(1000, "second");
      CHECK(device.memory_usage().allocated_bytes == 5096);
    }
    CHECK(device.memory_usage().allocated_bytes == 4096);
    backend::DeviceMemory moved = std::move(first);  // counted once, released once
    CHECK(device.memory_usage().allocated_bytes == 4096);
  }
  CHECK(device.memory_usage().allocated_bytes == 0);
  CHECK(device.memory_usage().peak_bytes == 5096);
}

TEST_CASE("the CPU device rounds fp32 to bf16 and fp16 to nearest even, and refuses others") {
  CpuDevice device;
  // 1 + 2^-8 is a tie between two bf16 values: to the even one (1); 1 + 3·2^-8 likewise, up
  // to 1 + 2^-6; -0 keeps its sign; NaN stays a quiet NaN; the largest float overflows to inf.
  std::vector<float> values = {1.0f + 0x1p-8f, 1.0f + 0x3p-8f, -0.0f, 3.0f,
                               std::numeric_limits<float>::quiet_NaN(),
                               std::numeric_limits<float>::max()};
  std::vector<uint16_t> bits(values.size(), 0xFFFF);
  ops::convert(device, View{bits.data(), std::ssize(bits), ElementType::bf16}, view_of(values));
  CHECK(bits[0] == 0x3F80);
  CHECK(bits[1] == 0x3F82);
  CHECK(bits[2] == 0x8000);
  CHECK(bits[3] == 0x4040);
  CHECK((bits[4] & 0x7FC0) == 0x7FC0);
  CHECK(bits[5] == 0x7F80);
  // fp16: ties at 1 + 2^-11 and 1 + 3·2^-11 to the even neighbours; 65520 (the tie above the
  // largest finite 65504) overflows; 2^-20 is subnormal; 2^-25 ties to zero.
  std::vector<float> for_fp16 = {1.0f + 0x1p-11f, 1.0f + 0x3p-11f, -0.0f, 3.0f,
                                 std::numeric_limits<float>::quiet_NaN(), 65520.0f,
                                 0x1p-20f, 0x1p-25f};
  std::vector<uint16_t> fp16_bits(for_fp16.size(), 0xFFFF);
  ops::convert(device, View{fp16_bits.data(), std::ssize(fp16_bits), ElementType::f16},
               view_of(for_fp16));
  CHECK(fp16_bits ==
        std::vector<uint16_t>{0x3C00, 0x3C02, 0x8000, 0x4200, fp16_bits[4], 0x7C00, 0x0010, 0});
  CHECK((fp16_bits[4] & 0x7E00) == 0x7E00);
  std::vector<double> wide(6);
  CHECK_THROWS_WITH_AS(ops::convert(device, view_of(wide), view_of(values)),
                       "convert: 6 elements of fp32 into 6 elements of fp64: a conversion makes "
                       "bf16 or fp16 from fp32, or fp32 from bf16 or fp16, of one element count",
                       common::Error);
  CHECK_THROWS_WITH_AS(
      ops::convert(device, View{bits.data(), 5, ElementType::bf16}, view_of(values)),
      doctest::Contains("6 elements of fp32 into 5 elements of bf16"), common::Error);
}

TEST_CASE("the CPU device copies views of any element type, in place too, and refuses a mismatch") {
  CpuDevice device;
  auto source = random_values<double>(33, 9);
  std::vector<double> destination(33, -1.0);
  device.copy(view_of(destination), view_of(source));
  CHECK(destination == source);
  device.copy(view_of(destination), view_of(destination));  // the same view: unchanged
  CHECK(destination == source);
  // bf16 is moved, never computed: no kernel is needed for a copy.
  std::vector<uint16_t> half = {1, 2, 3}, half_copy(3);
  device.copy(View{half_copy.data(), 3, ElementType::bf16},
              View{half.data(), 3, ElementType::bf16});
  CHECK(half_copy == half);
  device.copy(View{nullptr, 0, ElementType::f32}, View{nullptr, 0, ElementType::f32});

  std::vector<float> single(33), shorter(32);
  CHECK_THROWS_WITH_AS(device.copy(view_of(single), view_of(source)),
                       "copy: 33 elements of fp64 into 33 elements of fp32: a copy keeps the "
                       "element type and count",
                       common::Error);
  CHECK_THROWS_WITH_AS(device.copy(view_of(shorter), view_of(single)),
                       "copy: 33 elements of fp32 into 32 elements of fp32: a copy keeps the "
                       "element type and count",
                       common::Error);
  View on_gpu = view_of(single);
  on_gpu.on = MemoryKind::cuda;
  CHECK_THROWS_WITH_AS(device.copy(view_of(single), on_gpu),
                       "the CPU device was given GPU memory (33 elements of fp32)", common::Error);
}

TEST_CASE("the CPU device's embedding backward refuses a token index of the wrong size") {
  // B·T = 6 positions take an index of 3·6 + 2 = 20 ints (index_tokens); the tokens themselves
  // (6 ints) are not an index.
  const int64_t batch = 2, seq = 3, hidden = 4;
  std::vector<float> dword(5 * hidden), doutput(batch * seq * hidden);
  std::vector<int32_t> tokens(batch * seq, 1);
  CpuDevice device;
  CHECK_THROWS_WITH_AS(
      ops::embedding_backward(device, view_of(dword), View{nullptr, 0, ElementType::f32},
                              view_of(doutput), view_of(tokens), batch, seq, hidden, 0),
      "embedding_backward: a token index of 6 elements for 6 positions, which take 20 "
      "(index_tokens in backend/ops/embedding.hpp)",
      common::Error);
}
