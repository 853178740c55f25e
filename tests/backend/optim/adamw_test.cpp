// AdamW and global-norm clipping against the formulas written out in double; the norm's
// fixed summation order (the same bits on any thread count).
#include "backend/ops/adamw.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <vector>

#include "backend/common/error.hpp"
#include "backend/device/cpu_device.hpp"
#include "backend/optim/adamw.hpp"
#include "tests/backend/ops/gradient_check.hpp"

using namespace backend;

TEST_CASE("two AdamW steps match torch.optim.AdamW's update written out in double") {
  const AdamWConfig config{.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
  std::vector<float> parameters = {0.5f, -1.0f, 2.0f, 0.25f};
  const std::vector<std::vector<float>> gradients = {{0.1f, -0.2f, 0.3f, 0.0f},
                                                     {-0.05f, 0.4f, 0.1f, 1.0f}};
  // Elements 0..1 decay, 2..3 do not (a bias or norm weight).
  AdamW optimizer(config, {{0, 2, true}, {2, 2, false}}, 4);
  std::vector<double> p(parameters.begin(), parameters.end()), m(4, 0), v(4, 0);
  const double lr = 1e-2;
  for (int step = 1; step <= 2; ++step) {
    optimizer.step(parameters, gradients[step - 1], lr);
    for (int i = 0; i < 4; ++i) {
      const double g = gradients[step - 1][i];
      const double decay = i < 2 ? config.weight_decay : 0.0;
      p[i] *= 1 - lr * decay;
      m[i] = config.beta1 * m[i] + (1 - config.beta1) * g;
      v[i] = config.beta2 * v[i] + (1 - config.beta2) * g * g;
      const double m_hat = m[i] / (1 - std::pow(config.beta1, step));
      const double v_hat = v[i] / (1 - std::pow(config.beta2, step));
      p[i] -= lr * m_hat / (std::sqrt(v_hat) + config.eps);
    }
  }
  for (int i = 0; i < 4; ++i) CHECK(parameters[i] == doctest::Approx(p[i]).epsilon(1e-6));
  CHECK(optimizer.steps_taken() == 2);
}

TEST_CASE("gradient norm and clipping follow Megatron's clip_grad_norm") {
  std::vector<float> gradients = {3.0f, 4.0f};
  const double norm = global_gradient_norm(gradients);
  CHECK(norm == doctest::Approx(5.0));
  clip_gradients(gradients, norm, 10.0);  // under the limit: unchanged
  CHECK(gradients[0] == 3.0f);
  clip_gradients(gradients, norm, 1.0);
  CHECK(gradients[0] == doctest::Approx(3.0 / (5.0 + 1e-6)));
  CHECK(global_gradient_norm(gradients) == doctest::Approx(1.0).epsilon(1e-5));
  std::vector<float> unclipped = {3.0f, 4.0f};
  clip_gradients(unclipped, 5.0, 0.0);  // max_norm 0 disables clipping
  CHECK(unclipped[1] == 4.0f);
}

TEST_CASE("the gradient norm does not depend on how the buffer is chunked") {
  std::vector<float> gradients(300000);
  for (size_t i = 0; i < gradients.size(); ++i) gradients[i] = std::sin(static_cast<float>(i));
  double expected = 0;
  for (float g : gradients) expected += static_cast<double>(g) * g;
  CHECK(global_gradient_norm(gradients) == doctest::Approx(std::sqrt(expected)).epsilon(1e-12));
}

TEST_CASE("the gradient norm is the same on one thread and on three") {
  // Several chunks of 65536 and a remainder that is not a whole number of lanes.
  std::vector<float> gradients(3 * 65536 + 1001);
  for (size_t i = 0; i < gradients.size(); ++i) {
    gradients[i] = std::sin(static_cast<float>(i) * 0.37f) * (1.0f + static_cast<float>(i % 7));
  }
  const auto [serial, parallel] =
      backend::testing::on_one_and_three_threads([&] { return global_gradient_norm(gradients); });
  CHECK(serial == parallel);
  double expected = 0;
  for (float g : gradients) expected += static_cast<double>(g) * g;
  CHECK(serial == doctest::Approx(std::sqrt(expected)).epsilon(1e-12));
}

namespace {

View host_view(std::vector<float>& values) { return backend::host_view(std::span(values)); }

std::vector<float> wave(size_t count, float phase) {
  std::vector<float> values(count);
  for (size_t i = 0; i < count; ++i) values[i] = 0.01f * std::sin(phase + 0.7f * static_cast<float>(i));
  return values;
}

}  // namespace

TEST_CASE("AdamW on a Device: the device form, the host form and merged groups agree bit for bit") {
  const AdamWConfig config{.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
  const size_t count = 1000;
  // Five tensors; adjacent ones with the same decay merge into three updates. The merged run
  // must be elementwise the same computation.
  const std::vector<ParameterGroup> groups = {
      {0, 300, true}, {300, 200, true}, {500, 10, false}, {510, 90, false}, {600, 400, true}};
  CpuDevice device;
  AdamW on_device(config, groups, static_cast<int64_t>(count), device);
  AdamW on_host(config, groups, static_cast<int64_t>(count));
  AdamW one_group_each(config, {{0, 500, true}, {500, 100, false}, {600, 400, true}},
                       static_cast<int64_t>(count));
  std::vector<float> a = wave(count, 0.0f), b = a, c = a;
  for (int step = 0; step < 3; ++step) {
    std::vector<float> gradients = wave(count, 1.0f + static_cast<float>(step));
    const double norm = on_device.gradient_norm(host_view(gradients));
    CHECK(norm == global_gradient_norm(gradients));  // the same order, the same bits
    on_device.clip_gradients(host_view(gradients), norm, 0.05);
    std::vector<float> reference = wave(count, 1.0f + static_cast<float>(step));
    clip_gradients(reference, global_gradient_norm(reference), 0.05);
    CHECK(gradients == reference);
    on_device.step(host_view(a), View{}, host_view(gradients), 1e-3, 0.1);
    on_host.step(b, gradients, 1e-3, 0.1);
    one_group_each.step(c, gradients, 1e-3, 0.1);
  }
  CHECK(a == b);
  CHECK(a == c);
  std::vector<float> exp_avg(count), exp_avg_sq(count);
  on_device.copy_moments_to_host(exp_avg, exp_avg_sq);
  CHECK(std::equal(exp_avg.begin(), exp_avg.end(), on_host.exp_avg().begin()));
  CHECK(std::equal(exp_avg_sq.begin(), exp_avg_sq.end(), on_host.exp_avg_sq().begin()));
  // The moments' way back in (a checkpoint load) lands them where the spans see them.
  AdamW restored(config, groups, static_cast<int64_t>(count), device);
  restored.copy_moments_from_host(exp_avg, exp_avg_sq);
  CHECK(std::equal(exp_avg.begin(), exp_avg.end(), restored.exp_avg().begin()));
}

TEST_CASE("clipping folded into the step gives the bits of clipping the gradients first") {
  const AdamWConfig config{.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
  const size_t count = 777;
  const std::vector<ParameterGroup> groups = {{0, 700, true}, {700, 77, false}};
  CpuDevice device;
  AdamW clipped_first(config, groups, static_cast<int64_t>(count), device);
  AdamW folded(config, groups, static_cast<int64_t>(count), device);
  std::vector<float> a = wave(count, 0.0f), b = a;
  for (int step = 0; step < 3; ++step) {
    std::vector<float> gradients = wave(count, 2.0f + static_cast<float>(step));
    const double norm = clipped_first.gradient_norm(host_view(gradients));
    const auto coefficient = clip_coefficient(norm, 0.05);
    REQUIRE(coefficient.has_value());
    std::vector<float> scaled = gradients;
    clipped_first.clip_gradients(host_view(scaled), norm, 0.05);
    clipped_first.step(host_view(a), View{}, host_view(scaled), 1e-3, 0.1);
    const std::vector<float> unchanged = gradients;
    folded.step(host_view(b), View{}, host_view(gradients), 1e-3, 0.1, *coefficient);
    CHECK(gradients == unchanged);  // read scaled, not written
  }
  CHECK(a == b);
  CHECK(std::equal(clipped_first.exp_avg().begin(), clipped_first.exp_avg().end(),
                   folded.exp_avg().begin()));
  CHECK(std::equal(clipped_first.exp_avg_sq().begin(), clipped_first.exp_avg_sq().end(),
                   folded.exp_avg_sq().begin()));
}

TEST_CASE("AdamW refuses sizes that are not its parameters', naming them") {
  AdamW optimizer(AdamWConfig{}, {{0, 8, true}}, 8);
  std::vector<float> parameters(8), gradients(7);
  CHECK_THROWS_WITH_AS(optimizer.step(parameters, gradients, 1e-3),
                       "AdamW: 8 parameters, but 8 master weights and 7 gradients were given",
                       common::Error);
  CHECK(optimizer.steps_taken() == 0);
  std::vector<float> short_moments(3), moments(8);
  CHECK_THROWS_WITH_AS(optimizer.copy_moments_to_host(short_moments, moments),
                       "AdamW::copy_moments_to_host: 3 values for 8 parameters", common::Error);
  CHECK_THROWS_WITH_AS(AdamW(AdamWConfig{}, {{4, 8, true}}, 8),
                       "AdamW: parameter group [4, 12) lies outside the 8 parameters",
                       common::Error);
}

TEST_CASE("the CPU device's AdamW update has no separate working copy") {
  CpuDevice device;
  std::vector<float> master(4), gradients(4), m(4), v(4);
  std::vector<uint16_t> bf16_bits(4);
  AdamWCoefficients c;
  const View weights{bf16_bits.data(), 4, ElementType::bf16, MemoryKind::host};
  CHECK_THROWS_WITH_AS(ops::adamw_update(device, host_view(master), weights, host_view(gradients),
                                         host_view(m), host_view(v), coefficients_view(c)),
                       doctest::Contains("a separate bf16 working copy is the CUDA device's"),
                       common::Error);
}

TEST_CASE("the multi-tensor update is one update per group, decayed where the group is") {
  // ops::adamw_update over groups (one call per step, as apex's multi_tensor_apply) against
  // the same update called group by group: the same bits; elements in no group untouched.
  CpuDevice device;
  const int64_t count = 50;
  std::vector<float> start(count), gradients(count);
  for (int64_t i = 0; i < count; ++i) {
    start[static_cast<size_t>(i)] = 0.1f * static_cast<float>(i % 7) - 0.3f;
    gradients[static_cast<size_t>(i)] = 0.05f * static_cast<float>(i % 5) - 0.1f;
  }
  const std::vector<AdamWGroup> groups = {
      {0, 10, true}, {10, 5, false}, {20, 25, true}, {45, 3, false}};
  AdamWCoefficients c{.step_size = 1e-2f, .decay = 0.05f};
  std::vector<float> fused = start, fused_m(count, 0.01f), fused_v(count, 0.02f);
  ops::adamw_update(device, host_view(fused), View{}, host_view(gradients), host_view(fused_m),
                    host_view(fused_v), coefficients_view(c), View{}, groups);
  std::vector<float> each = start, each_m(count, 0.01f), each_v(count, 0.02f);
  for (const AdamWGroup& group : groups) {
    AdamWCoefficients group_c = c;
    if (!group.decayed) group_c.decay = 0;
    const auto part = [&](std::vector<float>& values) {
      return host_view(std::span(values).subspan(static_cast<size_t>(group.offset),
                                                 static_cast<size_t>(group.numel)));
    };
    ops::adamw_update(device, part(each), View{}, part(gradients), part(each_m), part(each_v),
                      coefficients_view(group_c));
  }
  CHECK(each == fused);
  CHECK(each_m == fused_m);
  CHECK(each_v == fused_v);
  for (const int64_t untouched : {15, 19, 48, 49}) {
    CHECK(fused[static_cast<size_t>(untouched)] == start[static_cast<size_t>(untouched)]);
  }
  CHECK(fused[3] != start[3]);
  // Groups out of order, overlapping or past the end are refused by name.
  for (const std::vector<AdamWGroup>& bad : {std::vector<AdamWGroup>{{10, 5, true}, {0, 5, true}},
                                             std::vector<AdamWGroup>{{0, 10, true}, {5, 10, true}},
                                             std::vector<AdamWGroup>{{40, 11, true}}}) {
    CHECK_THROWS_WITH_AS(ops::adamw_update(device, host_view(fused), View{}, host_view(gradients),
                                           host_view(fused_m), host_view(fused_v),
                                           coefficients_view(c), View{}, bad),
                         doctest::Contains("adamw_update: the group"), common::Error);
  }
}

TEST_CASE("an update captured once, replayed after each step is staged, gives the eager steps") {
  // The coefficients (the rate, the decay, the bias corrections) change every step; they reach
  // the update through the device's memory (stage_step), so a captured update replayed after
  // each staging is each step's, bit for bit (docs/step_on_device.md, item 5).
  const AdamWConfig config{.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
  const int64_t count = 257;
  std::vector<float> start(count), gradients(count);
  for (int64_t i = 0; i < count; ++i) {
    start[static_cast<size_t>(i)] = 0.01f * static_cast<float>(i % 13) - 0.05f;
    gradients[static_cast<size_t>(i)] = 0.003f * static_cast<float>(i % 11) - 0.012f;
  }
  const std::vector<ParameterGroup> groups = {{0, 200, true}, {200, 57, false}};
  CpuDevice eager_device, captured_device;
  AdamW eager(config, groups, count, eager_device);
  AdamW captured(config, groups, count, captured_device);
  std::vector<float> eager_parameters = start, captured_parameters = start;
  std::unique_ptr<DeviceGraph> update;
  for (int step = 0; step < 6; ++step) {
    const double lr = 1e-2 * (step + 1) / 6.0;
    const double weight_decay = 0.1 - 0.01 * step;
    eager.step(host_view(std::span(eager_parameters)), View{},
               host_view(std::span<const float>(gradients)), lr, weight_decay);
    captured.stage_step(lr, weight_decay);
    const auto queue = [&] {
      captured.queue_step(host_view(std::span(captured_parameters)), View{},
                          host_view(std::span<const float>(gradients)));
    };
    if (step == 0) {
      queue();  // the first step eager, as the trainer's warm-up
    } else if (step == 1) {
      captured_device.begin_capture();
      queue();
      update = captured_device.end_capture();
      CHECK(update->nodes() == 1);
      update->replay();
    } else {
      update->replay();
    }
    CAPTURE(step);
    CHECK(std::memcmp(captured_parameters.data(), eager_parameters.data(),
                      eager_parameters.size() * sizeof(float)) == 0);
  }
  CHECK(captured.steps_taken() == 6);
  CHECK(eager_parameters != start);
  AdamW unstaged(config, groups, count, captured_device);
  CHECK_THROWS_WITH_AS(unstaged.queue_step(host_view(std::span(captured_parameters)), View{},
                                           host_view(std::span<const float>(gradients))),
                       doctest::Contains("no step's coefficients were staged"), common::Error);
}
