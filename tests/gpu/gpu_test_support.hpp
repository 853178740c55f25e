// Support for the GPU tests (tests/gpu/): open the CUDA device or skip, tensors on any Device
// through the Device interface and the ops only (no CUDA header here), and the comparison every op test
// uses: the normalised error max|a − b| / max(1e-6, max|b|) of the CUDA result a against the
// CPU device's fp32 result b on the same inputs, reported with the op, the shape and the index
// of the worst element. Outputs are poisoned (all bytes 0xFF: NaN in every float type) before an
// op runs, so an element the op forgot to write shows as NaN, which counts as an infinite
// error.
#pragma once

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "backend/core/element_type.hpp"
#include "backend/device/cpu_device.hpp"
#include "backend/device/cuda_device.hpp"
#include "backend/device/cuda_inventory.hpp"
#include "backend/device/cudnn_library.hpp"
#include "backend/device/device.hpp"
#include "backend/ops/adamw.hpp"
#include "backend/ops/attention.hpp"
#include "backend/ops/convert.hpp"
#include "backend/ops/cross_entropy.hpp"
#include "backend/ops/dropout.hpp"
#include "backend/ops/embedding.hpp"
#include "backend/ops/gelu.hpp"
#include "backend/ops/layernorm.hpp"
#include "backend/ops/linear.hpp"
#include "backend/ops/reduction.hpp"
#include "backend/ops/residual.hpp"
#include "backend/ops/rmsnorm.hpp"
#include "backend/ops/rope.hpp"
#include "backend/ops/swiglu.hpp"

namespace gpu_test {

using backend::Device;
using backend::ElementType;
using backend::View;

// Why there is no GPU to test on, or nothing: device discovery (cuda_inventory.hpp).
inline std::optional<std::string> no_gpu_reason() {
  const auto inventory = backend::discover_cuda_devices();
  if (!inventory.built_with_cuda) return std::string("this build has no CUDA");
  if (inventory.devices.empty()) {
    return inventory.unavailable_reason.empty() ? std::string("the CUDA runtime sees no GPU")
                                                : inventory.unavailable_reason;
  }
  return std::nullopt;
}

// The CUDA device 0, or nullptr after reporting the skip (the caller returns).
// GPU_TESTS_ON_CPU=1 (for checking the tests themselves on a machine without a GPU): the op
// tests that allow it get a second CpuDevice instead, and run their fp32 cases only.
inline std::unique_ptr<Device> open_gpu_or_skip(bool cpu_stand_in_allowed = false,
                                                const backend::CudaDeviceOptions& options = {}) {
  static const std::optional<std::string> reason = no_gpu_reason();
  const char* on_cpu = std::getenv("GPU_TESTS_ON_CPU");
  if (cpu_stand_in_allowed && on_cpu != nullptr && std::string(on_cpu) == "1") {
    MESSAGE("GPU_TESTS_ON_CPU=1: a CpuDevice stands in for the GPU (fp32 cases only)");
    return std::make_unique<backend::CpuDevice>();
  }
  if (reason) {
    MESSAGE("skipped: no CUDA GPU: " << *reason);
    return nullptr;
  }
  return backend::make_cuda_device(0, options);
}

// Whether the cuDNN this process loads takes attention dropout, after reporting the skip when
// not: 9.11.1-9.13.x do not (the gate in ops/attention_cudnn_cuda.cu, PyTorch's too).
inline bool cudnn_takes_attention_dropout_or_skip() {
  const int64_t version = backend::load_cudnn().version;
  if (version > 91100 && version < 91400) {
    MESSAGE("skipped: cuDNN " << version << " takes no attention dropout (9.11.1-9.13.x)");
    return false;
  }
  return true;
}

// Normal(0, 1) values, reproducible from the seed.
inline std::vector<float> random_values(int64_t count, uint32_t seed, float scale = 1.0f) {
  std::mt19937 generator(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> values(static_cast<size_t>(count));
  for (auto& value : values) value = normal(generator);
  return values;
}

// The values rounded through bf16 or fp16 when `type` is one of them, so the CPU reference sees
// exactly the inputs the 16-bit kernel sees.
inline std::vector<float> representable(std::vector<float> values, ElementType type) {
  if (type == ElementType::bf16) {
    for (auto& value : values) value = backend::to_float(backend::to_bfloat16(value));
  } else if (type == ElementType::f16) {
    for (auto& value : values) value = backend::to_float(backend::to_float16(value));
  }
  return values;
}

// Tensors of one device; freed with it.
class Tensors {
 public:
  explicit Tensors(Device& device) : device_(device) {}

  Device& device() { return device_; }

  // A tensor holding `values` converted to `type` (f32, bf16, f16, f64).
  View input(const std::vector<float>& values, ElementType type) {
    View view = allocate(static_cast<int64_t>(values.size()), type);
    std::vector<unsigned char> bytes(static_cast<size_t>(view.bytes()));
    for (size_t i = 0; i < values.size(); ++i) {
      switch (type) {
        case ElementType::f32: std::memcpy(&bytes[i * 4], &values[i], 4); break;
        case ElementType::bf16: {
          const backend::bfloat16 rounded = backend::to_bfloat16(values[i]);
          std::memcpy(&bytes[i * 2], &rounded, 2);
          break;
        }
        case ElementType::f16: {
          const backend::float16 rounded = backend::to_float16(values[i]);
          std::memcpy(&bytes[i * 2], &rounded, 2);
          break;
        }
        case ElementType::f64: {
          const double wide = values[i];
          std::memcpy(&bytes[i * 8], &wide, 8);
          break;
        }
        default: FAIL("input: unsupported element type");
      }
    }
    device_.copy_from_host(view, bytes.data());
    return view;
  }
  View ids(const std::vector<int32_t>& values) {
    View view = allocate(static_cast<int64_t>(values.size()), ElementType::i32);
    device_.copy_from_host(view, values.data());
    return view;
  }
  // `count` elements of all-ones bytes: NaN in every float type.
  View poisoned(int64_t count, ElementType type) {
    View view = allocate(count, type);
    std::vector<unsigned char> bytes(static_cast<size_t>(view.bytes()), 0xFF);
    device_.copy_from_host(view, bytes.data());
    return view;
  }
  View empty(ElementType type) { return View{nullptr, 0, type, device_.memory_kind()}; }
  // `dropout` with its key in this device's memory (Dropout::stored_key, as a captured step
  // passes it) and the complement by value, so that an op reading the value draws another mask.
  backend::Dropout with_stored_key(backend::Dropout dropout) {
    View key = allocate(1, ElementType::u64);
    device_.copy_from_host(key, &dropout.key);
    dropout.key = ~dropout.key;
    dropout.stored_key = static_cast<const uint64_t*>(key.data);
    return dropout;
  }

  std::vector<float> read(View view) {
    std::vector<unsigned char> bytes(static_cast<size_t>(view.bytes()));
    device_.copy_to_host(bytes.data(), view);
    std::vector<float> values(static_cast<size_t>(view.numel));
    for (size_t i = 0; i < values.size(); ++i) {
      switch (view.type) {
        case ElementType::f32: std::memcpy(&values[i], &bytes[i * 4], 4); break;
        case ElementType::bf16: {
          backend::bfloat16 value;
          std::memcpy(&value, &bytes[i * 2], 2);
          values[i] = backend::to_float(value);
          break;
        }
        case ElementType::f16: {
          backend::float16 value;
          std::memcpy(&value, &bytes[i * 2], 2);
          values[i] = backend::to_float(value);
          break;
        }
        case ElementType::f64: {
          double wide;
          std::memcpy(&wide, &bytes[i * 8], 8);
          values[i] = static_cast<float>(wide);
          break;
        }
        default: FAIL("read: unsupported element type");
      }
    }
    return values;
  }
  double read_f64(View view) {
    double value = 0;
    device_.copy_to_host(&value, view);
    return value;
  }

 private:
  View allocate(int64_t count, ElementType type) {
    memory_.push_back(
        device_.allocate_zeroed(count * backend::element_size(type), "a test tensor"));
    return View{memory_.back().data(), count, type, device_.memory_kind()};
  }

  Device& device_;
  std::vector<backend::DeviceMemory> memory_;
};

// Checks max|a − b| / max(1e-6, max|b|) ≤ tolerance; NaN or a size mismatch fails. `what`
// names the op, the output, the type and the shape.
inline void expect_close(const std::string& what, const std::vector<float>& actual,
                         const std::vector<float>& expected, double tolerance) {
  if (actual.size() != expected.size()) {
    FAIL_CHECK(what << ": " << actual.size() << " elements, expected " << expected.size());
    return;
  }
  double scale = 0, worst = 0;
  size_t worst_index = 0;
  for (float value : expected) scale = std::max(scale, std::fabs(static_cast<double>(value)));
  scale = std::max(scale, 1e-6);
  for (size_t i = 0; i < actual.size(); ++i) {
    const double error =
        std::isnan(actual[i]) != std::isnan(expected[i])
            ? std::numeric_limits<double>::infinity()
            : (std::isnan(actual[i]) ? 0.0
                                     : std::fabs(static_cast<double>(actual[i]) - expected[i]));
    if (!(error <= worst)) {
      worst = error;
      worst_index = i;
    }
  }
  const double normalised = worst / scale;
  INFO(what << ": max error " << normalised << " (normalised by max|ref| " << scale << ") at "
            << worst_index << " of " << actual.size() << ": got "
            << (actual.empty() ? 0.0f : actual[worst_index]) << ", expected "
            << (expected.empty() ? 0.0f : expected[worst_index]) << "; tolerance " << tolerance);
  CHECK(normalised <= tolerance);
}

// The same bits (NaN included).
inline void expect_identical(const std::string& what, const std::vector<float>& first,
                             const std::vector<float>& second) {
  INFO(what << ": two runs on the same inputs differ");
  CHECK(first.size() == second.size());
  if (first.size() == second.size()) {
    CHECK(std::memcmp(first.data(), second.data(), first.size() * sizeof(float)) == 0);
  }
}

inline const char* type_name(ElementType type) {
  return backend::element_name(type).data();  // the names are string literals
}

// Tolerance of an op's result: fp32 runs differ from the CPU by summation order only; bf16
// runs also round every input and output to 8 bits of significand, fp16 runs to 11 (an eighth
// of bf16's rounding error; a quarter of its tolerance leaves a factor of 2).
inline double tolerance(ElementType type, double fp32, double bf16 = 2e-2) {
  if (type == ElementType::bf16) return bf16;
  if (type == ElementType::f16) return std::max(fp32, bf16 / 4);
  return fp32;
}

}  // namespace gpu_test

namespace gpu_test {

// Named outputs of one run of an op.
using Outputs = std::vector<std::pair<std::string, std::vector<float>>>;

// Runs `run(tensors, type)` (which allocates its inputs and poisoned outputs through `tensors`,
// calls the op and reads the outputs back) on the CPU device in fp32 (the reference) and on
// `gpu` in `type`, compares every output at `tolerance`, and runs the GPU twice to check that
// the results are the same bits. Inputs must already be representable in `type`.
template <typename Run>
void check_against_cpu(Device& gpu, const std::string& what, ElementType type, double tol,
                       Run run) {
  if (gpu.memory_kind() == backend::MemoryKind::host && type != ElementType::f32) return;
  backend::CpuDevice cpu;
  Tensors cpu_tensors(cpu);
  const Outputs expected = run(cpu_tensors, ElementType::f32);
  Tensors gpu_tensors(gpu);
  const Outputs actual = run(gpu_tensors, type);
  REQUIRE(actual.size() == expected.size());
  for (size_t i = 0; i < actual.size(); ++i) {
    expect_close(what + " " + type_name(type) + " → " + actual[i].first, actual[i].second,
                 expected[i].second, tol);
  }
  Tensors again(gpu);
  const Outputs second = run(again, type);
  for (size_t i = 0; i < actual.size(); ++i) {
    expect_identical(what + " " + type_name(type) + " → " + actual[i].first, actual[i].second,
                     second[i].second);
  }
}

}  // namespace gpu_test
