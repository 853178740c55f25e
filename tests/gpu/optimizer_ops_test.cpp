// The optimizer's device ops on the CUDA device against the CPU device: the AdamW update (fp32
// master, and with a bf16 working copy that must equal the rounded master), the sum of squares
// behind the gradient norm, and scaling (clipping, loss-scale unscaling), on awkward sizes
// (1, 7 and 1 000 003 elements), outputs poisoned where the op writes them, run to run
// identical. The AdamW object itself on the CUDA device: three steps with clipping agree with
// the same on the CPU. The step's scalars (ops/step_scalars.hpp) and AdamW reading the decision.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "backend/ops/step_scalars.hpp"
#include "backend/optim/adamw.hpp"
#include "gpu/gpu_test_support.hpp"

using backend::AdamWCoefficients;
using backend::ElementType;
using backend::View;
namespace ops = backend::ops;
using namespace gpu_test;

namespace {

constexpr int64_t kSizes[] = {1, 7, 1000003};

// A step's coefficients in `t`'s device memory, where the update reads them.
View coefficients(Tensors& t, int step, double lr, double weight_decay,
                  float gradient_scale = 1.0f) {
  const double beta1 = 0.9, beta2 = 0.95;
  const AdamWCoefficients c{
      .beta1 = static_cast<float>(beta1),
      .beta2 = static_cast<float>(beta2),
      .eps = 1e-8f,
      .step_size = static_cast<float>(lr / (1 - std::pow(beta1, step))),
      .inverse_sqrt_correction2 = static_cast<float>(1 / std::sqrt(1 - std::pow(beta2, step))),
      .decay = static_cast<float>(lr * weight_decay),
      .gradient_scale = gradient_scale};
  std::vector<float> floats(backend::kAdamWCoefficientFloats);
  std::memcpy(floats.data(), &c, sizeof c);
  return t.input(floats, ElementType::f32);
}

}  // namespace

TEST_CASE("the AdamW update on the CUDA device matches the CPU device") {
  auto gpu = open_gpu_or_skip(/*cpu_stand_in_allowed=*/true);
  if (!gpu) return;
  for (const int64_t count : kSizes) {
    const auto master = random_values(count, 11, 0.5f);
    const auto gradients = random_values(count, 12, 1e-2f);
    const auto exp_avg = random_values(count, 13, 1e-3f);
    auto exp_avg_sq = random_values(count, 14, 1e-4f);
    for (auto& value : exp_avg_sq) value = value * value;  // a second moment is ≥ 0
    const std::string what = "adamw_update of " + std::to_string(count) + " elements";
    check_against_cpu(*gpu, what, ElementType::f32, 1e-6, [&](Tensors& t, ElementType) {
      View p = t.input(master, ElementType::f32), m = t.input(exp_avg, ElementType::f32), v = t.input(exp_avg_sq, ElementType::f32);
      const View g = t.input(gradients, ElementType::f32);
      ops::adamw_update(t.device(), p, t.empty(ElementType::bf16), g, m, v,
                        coefficients(t, 3, 1e-3, 0.1));
      ops::adamw_update(t.device(), p, t.empty(ElementType::bf16), g, m, v,
                        coefficients(t, 4, 1e-3, 0.0));
      return Outputs{{"master", t.read(p)}, {"exp_avg", t.read(m)}, {"exp_avg_sq", t.read(v)}};
    });
    if (gpu->memory_kind() == backend::MemoryKind::host) continue;  // 16-bit: the GPU's alone
    // With a bf16 or fp16 working copy: the master as in fp32, and the copy is the master
    // rounded.
    for (const ElementType type : {ElementType::bf16, ElementType::f16}) {
      Tensors t(*gpu);
      View p = t.input(master, ElementType::f32), m = t.input(exp_avg, ElementType::f32), v = t.input(exp_avg_sq, ElementType::f32);
      View weights = t.poisoned(count, type);
      ops::adamw_update(*gpu, p, weights, t.input(gradients, ElementType::f32), m, v,
                        coefficients(t, 3, 1e-3, 0.1));
      expect_identical(what + " " + type_name(type) + " working copy = rounded master",
                       t.read(weights), representable(t.read(p), type));
    }
  }
}

TEST_CASE("sum, sum of squares, count of zeros and scale on the CUDA device match the CPU device") {
  auto gpu = open_gpu_or_skip(/*cpu_stand_in_allowed=*/true);
  if (!gpu) return;
  for (const int64_t count : kSizes) {
    for (const ElementType type : {ElementType::f32, ElementType::bf16, ElementType::f16}) {
      auto values = representable(random_values(count, 21, 3.0f), type);
      // Zeros of both signs to count (--log-num-zeros-in-grad).
      for (size_t i = 0; i < values.size(); i += 7) values[i] = i % 2 == 0 ? 0.0f : -0.0f;
      const std::string what = "reductions of " + std::to_string(count) + " elements";
      check_against_cpu(*gpu, what, type, 1e-6, [&](Tensors& t, ElementType dtype) {
        View input = t.input(values, dtype);
        View total = t.poisoned(1, ElementType::f64);
        View squares = t.poisoned(1, ElementType::f64);
        ops::sum(t.device(), total, input);
        ops::sum_of_squares(t.device(), squares, input);
        return Outputs{{"sum", {static_cast<float>(t.read_f64(total))}},
                       {"sum of squares", {static_cast<float>(t.read_f64(squares))}}};
      });
      // A count: the same number on both devices, exactly.
      // And times a clipping factor read from the device's memory (the step's decision): the
      // elements it takes below the type's smallest subnormal count too.
      std::vector<float> with_tiny = values;
      for (size_t i = 3; i < with_tiny.size(); i += 11) with_tiny[i] = 3e-38f;
      check_against_cpu(*gpu, what, type, 0.0, [&](Tensors& t, ElementType dtype) {
        View zeros = t.poisoned(1, ElementType::f64);
        ops::count_zeros(t.device(), zeros, t.input(values, dtype));
        View clipped_zeros = t.poisoned(1, ElementType::f64);
        ops::count_zeros(t.device(), clipped_zeros, t.input(with_tiny, dtype),
                         t.input({1e-8f}, ElementType::f64));
        return Outputs{
            {"count of zeros", {static_cast<float>(t.read_f64(zeros))}},
            {"count of zeros after clipping", {static_cast<float>(t.read_f64(clipped_zeros))}}};
      });
      // Scaling by a power of two is exact in every type: the CUDA result must be the same bits.
      check_against_cpu(*gpu, what, type, 0.0, [&](Tensors& t, ElementType dtype) {
        View input = t.input(values, dtype);
        ops::scale(t.device(), input, 0.125);
        return Outputs{{"scaled by 1/8", t.read(input)}};
      });
      check_against_cpu(*gpu, what, type, tolerance(type, 1e-7, 4e-3),
                        [&](Tensors& t, ElementType dtype) {
                          View input = t.input(values, dtype);
                          ops::scale(t.device(), input, 0.3);
                          return Outputs{{"scaled by 0.3", t.read(input)}};
                        });
    }
  }
}

TEST_CASE("AdamW on the CUDA device takes the CPU device's steps, clipping included") {
  auto gpu = open_gpu_or_skip(/*cpu_stand_in_allowed=*/true);
  if (!gpu) return;
  const int64_t count = 4099;
  const std::vector<backend::ParameterGroup> groups = {{0, 4000, true}, {4000, 99, false}};
  const backend::AdamWConfig config{.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
  const auto initial = random_values(count, 31, 0.02f);
  std::vector<std::vector<float>> gradient_steps;
  for (uint32_t step = 0; step < 3; ++step) gradient_steps.push_back(random_values(count, 40 + step));
  check_against_cpu(*gpu, "three AdamW steps", ElementType::f32, 1e-5, [&](Tensors& t, ElementType) {
    backend::AdamW optimizer(config, groups, count, t.device());
    View parameters = t.input(initial, ElementType::f32);
    std::vector<float> norms;
    for (const auto& step_gradients : gradient_steps) {
      View gradients = t.input(step_gradients, ElementType::f32);
      const double norm = optimizer.gradient_norm(gradients);
      norms.push_back(static_cast<float>(norm));
      // The norm is about 64: clipped, by a pass over the gradients on odd steps and folded
      // into the update on even ones (the same bits on either device).
      if (norms.size() % 2 == 1) {
        optimizer.clip_gradients(gradients, norm, 1.0);
        optimizer.step(parameters, t.empty(ElementType::bf16), gradients, 1e-3, 0.1);
      } else {
        optimizer.step(parameters, t.empty(ElementType::bf16), gradients, 1e-3, 0.1,
                       *backend::clip_coefficient(norm, 1.0));
      }
    }
    std::vector<float> exp_avg(count), exp_avg_sq(count);
    optimizer.copy_moments_to_host(exp_avg, exp_avg_sq);
    return Outputs{{"parameters", t.read(parameters)},
                   {"gradient norms", norms},
                   {"exp_avg", exp_avg},
                   {"exp_avg_sq", exp_avg_sq}};
  });
}

TEST_CASE("the step's scalars and AdamW's device decision on the CUDA device are the CPU's bits") {
  // ops/step_scalars.hpp: one thread in double on both, so the bits must agree exactly; then
  // AdamW reading the decision: a skip leaves every buffer as it was.
  auto gpu = open_gpu_or_skip(/*cpu_stand_in_allowed=*/true);
  if (!gpu) return;
  backend::CpuDevice cpu;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  struct Case {
    double loss, sum_of_squares, max_norm;
    bool loss_decides;
  };
  for (const Case c :
       {Case{2.5, 25.0, 1.0, true}, Case{2.5, 0.25, 1.0, true}, Case{nan, 4.0, 1.0, true},
        Case{nan, 4.0, 1.0, false}, Case{1.0, nan, 1.0, false}, Case{1.0, 123.456, 0.0, true}}) {
    auto on = [&](backend::Device& device) {
      Tensors t(device);
      View total = t.input({0.0f}, ElementType::f64);
      View micro = t.input({7.0f}, ElementType::f64);
      ops::accumulate_loss(device, total, micro, 3, false, true);
      ops::accumulate_loss(device, total, micro, 5, true, true);
      View loss = t.input({0.0f}, ElementType::f64);
      View squares = t.input({0.0f}, ElementType::f64);
      device.copy_from_host(loss, &c.loss);
      device.copy_from_host(squares, &c.sum_of_squares);
      ops::add(device, squares, t.input({0.0f}, ElementType::f64));
      View control = t.poisoned(2, ElementType::f64);
      ops::decide_step(device, control, c.loss_decides ? loss : t.empty(ElementType::f64), squares,
                       c.max_norm);
      std::vector<double> out(3);
      device.copy_to_host(out.data(), control);
      out[2] = t.read_f64(total);
      return out;
    };
    const std::vector<double> expected = on(cpu), actual = on(*gpu);
    CAPTURE(c.sum_of_squares);
    CHECK(std::memcmp(actual.data(), expected.data(), 3 * sizeof(double)) == 0);
  }
  const auto master = random_values(1000003, 31, 0.5f);
  const auto gradients = random_values(1000003, 32, 1e-2f);
  for (const double skip : {0.0, 1.0}) {
    Tensors t(*gpu);
    View p = t.input(master, ElementType::f32), m = t.input(master, ElementType::f32),
         v = t.input(master, ElementType::f32);
    View control = t.input({0.25f, static_cast<float>(skip)}, ElementType::f64);
    ops::adamw_update(*gpu, p, t.empty(ElementType::bf16), t.input(gradients, ElementType::f32), m,
                      v, coefficients(t, 2, 1e-3, 0.1), control);
    if (skip != 0.0) {
      expect_identical("a skipped AdamW update leaves the master", t.read(p), master);
    } else {
      Tensors host(cpu);
      View hp = host.input(master, ElementType::f32), hm = host.input(master, ElementType::f32),
           hv = host.input(master, ElementType::f32);
      ops::adamw_update(cpu, hp, host.empty(ElementType::bf16),
                        host.input(gradients, ElementType::f32), hm, hv,
                        coefficients(host, 2, 1e-3, 0.1, /*gradient_scale=*/0.25f));
      expect_close("AdamW with the device's factor against the CPU's host factor", t.read(p),
                   host.read(hp), 1e-6);
    }
  }
}

TEST_CASE("the multi-tensor AdamW on the CUDA device matches the CPU's, groups over launches") {
  // More groups than one launch takes (kAdamWGroupsPerLaunch), some longer than a block's chunk
  // (kAdamWChunk), gaps between some, decay alternating.
  auto gpu = open_gpu_or_skip(/*cpu_stand_in_allowed=*/true);
  if (!gpu) return;
  std::vector<backend::AdamWGroup> groups;
  int64_t offset = 0;
  for (int i = 0; i < 300; ++i) {
    const int64_t numel = i % 37 == 0 ? 3 * backend::kAdamWChunk + 5 : 1 + (i * 977) % 4000;
    groups.push_back({offset, numel, i % 2 == 0});
    offset += numel + (i % 5 == 0 ? 17 : 0);
  }
  const int64_t count = offset;
  const auto master = random_values(count, 41, 0.5f);
  const auto gradients = random_values(count, 42, 1e-2f);
  auto squares = random_values(count, 43, 1e-2f);
  for (auto& value : squares) value = value * value;  // a second moment is ≥ 0
  check_against_cpu(
      *gpu, "multi-tensor adamw_update", ElementType::f32, 1e-6, [&](Tensors& t, ElementType) {
        View p = t.input(master, ElementType::f32);
        View m = t.input(gradients, ElementType::f32);
        View v = t.input(squares, ElementType::f32);
        ops::adamw_update(t.device(), p, t.empty(ElementType::bf16),
                          t.input(gradients, ElementType::f32), m, v, coefficients(t, 3, 1e-3, 0.1),
                          t.empty(ElementType::f64), groups);
        return Outputs{{"master", t.read(p)}, {"exp_avg", t.read(m)}};
      });
}
