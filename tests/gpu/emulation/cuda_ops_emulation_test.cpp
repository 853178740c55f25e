// The memory-bound CUDA ops of every training step (backend/ops: the fused classifier and the
// cross entropy's other kernels, LayerNorm and RMSNorm with the residual add fused in, forward
// and backward) run on the CPU through their own host side, each launch's blocks under
// warp_emulator.hpp (extract_cuda_ops.py rewrote the .cu files as host C++), against their CPU
// twins on the same inputs. Sizes cover the 16-byte packs and the scalar path (a row length the
// pack does not divide), ignored labels and labels at the vocabulary's ends, a scale read from
// device memory (a captured step's), two vocabulary shards combined, and the backward's
// accumulating mode. Where CI has no GPU this is what checks the kernels' indexing, reductions
// and barriers; tests/gpu/ops_test.cpp checks them on a GPU.
#include <cuda_runtime.h>
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "gpu/emulation/warp_emulator.hpp"
// A launch is checked by CUDA_CHECK(cudaGetLastError()); an emulated one ran on the host and
// left no error behind (the runtime, with no GPU here, would report its absence instead).
#define cudaGetLastError() (::cudaSuccess)
#include "cuda_ops.inc"

using backend::bfloat16;
using backend::InputGradient;
using backend::ResidualAdd;

namespace emulated = backend::cuda_emulated;

namespace {

std::vector<float> random_values(size_t count, uint32_t seed, float spread) {
  std::mt19937 generator(seed);
  std::normal_distribution<float> normal(0.0F, spread);
  std::vector<float> values(count);
  for (float& value : values) value = normal(generator);
  return values;
}

// The values as S holds them (bf16 rounded to nearest even), and back as floats: what the CPU
// twin is given, so both twins see the same inputs.
template <typename S>
std::vector<S> as_element(const std::vector<float>& values) {
  std::vector<S> converted(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    if constexpr (std::is_same_v<S, bfloat16>) {
      converted[i] = backend::to_bfloat16(values[i]);
    } else {
      converted[i] = values[i];
    }
  }
  return converted;
}
template <typename S>
std::vector<float> widened(const std::vector<S>& values) {
  std::vector<float> result(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    if constexpr (std::is_same_v<S, bfloat16>) {
      result[i] = backend::to_float(values[i]);
    } else {
      result[i] = values[i];
    }
  }
  return result;
}

// |actual − expected| ≤ absolute + relative · |expected| everywhere (the two twins sum in other
// orders; a bf16 output is rounded once more).
void check_close(const std::vector<float>& actual, const std::vector<float>& expected,
                 double absolute, double relative, const char* what) {
  REQUIRE(actual.size() == expected.size());
  size_t worst = 0;
  double worst_excess = -1;
  for (size_t i = 0; i < actual.size(); ++i) {
    const double allowed = absolute + relative * std::abs(expected[i]);
    const double excess = std::abs(double{actual[i]} - double{expected[i]}) - allowed;
    if (!(excess <= 0) || std::isnan(actual[i])) {
      if (std::isnan(actual[i]) || excess > worst_excess) {
        worst_excess = std::isnan(actual[i]) ? INFINITY : excess;
        worst = i;
      }
    }
  }
  INFO(std::string(what) << ": element " << worst << " is " << actual[worst] << ", the CPU twin's "
                         << expected[worst]);
  CHECK(worst_excess < 0);
}

template <typename S>
constexpr double output_tolerance() {
  return std::is_same_v<S, bfloat16> ? 1.0 / 128 : 2e-6;
}

// Six rows: ordinary labels, the vocabulary's first and last ids, an ignored position.
std::vector<int32_t> labels_for(int64_t vocab_size) {
  return {3,
          0,
          static_cast<int32_t>(vocab_size - 1),
          backend::kIgnoredLabel,
          17,
          static_cast<int32_t>(vocab_size / 2)};
}

template <typename S>
void check_fused_classifier(int64_t vocab_size, bool stored) {
  CAPTURE(vocab_size);
  CAPTURE(stored);
  const std::vector<int32_t> labels = labels_for(vocab_size);
  const int64_t rows = std::ssize(labels);
  const std::vector<S> logits = as_element<S>(
      random_values(static_cast<size_t>(rows * vocab_size), static_cast<uint32_t>(vocab_size), 3));
  const float scale = 0.25F;
  const double stored_scale = 0.5;  // what a captured step reads in place of `scale`
  std::vector<float> losses(static_cast<size_t>(rows)), logsumexp(losses.size());
  std::vector<S> dlogits = logits;
  emulated::cross_entropy_forward_backward<S>(
      losses.data(), logsumexp.data(), dlogits.data(), labels.data(), scale,
      stored ? &stored_scale : nullptr, rows, vocab_size, nullptr);
  std::vector<float> expected_losses(losses.size()), expected_logsumexp(losses.size());
  std::vector<float> expected_dlogits = widened(logits);
  backend::cpu::cross_entropy_forward_backward<float>(
      expected_losses.data(), expected_logsumexp.data(), expected_dlogits.data(), labels.data(),
      stored ? static_cast<float>(stored_scale) : scale, rows, vocab_size);
  check_close(losses, expected_losses, 1e-5, 1e-5, "losses");
  check_close(logsumexp, expected_logsumexp, 1e-5, 1e-5, "logsumexp");
  check_close(widened(dlogits), expected_dlogits, 1e-7, output_tolerance<S>(), "dlogits");
}

}  // namespace

TEST_CASE(
    "the fused classifier's CUDA kernel under emulation gives its CPU twin's losses and "
    "gradient") {
  for (const bool stored : {false, true}) {
    // 1000: whole packs of four floats or eight bf16; 777: the scalar path.
    for (const int64_t vocab_size : {int64_t{1000}, int64_t{777}}) {
      check_fused_classifier<float>(vocab_size, stored);
      check_fused_classifier<bfloat16>(vocab_size, stored);
    }
  }
}

TEST_CASE(
    "the cross entropy's forward, backward and vocabulary-parallel kernels under "
    "emulation give their CPU twins' results") {
  const int64_t vocab_size = 1000, shard = 504;  // two shards: 504 and 496 columns
  const std::vector<int32_t> labels = labels_for(vocab_size);
  const int64_t rows = std::ssize(labels);
  const std::vector<bfloat16> logits =
      as_element<bfloat16>(random_values(static_cast<size_t>(rows * vocab_size), 7, 3));
  const std::vector<float> wide = widened(logits);
  std::vector<float> expected_losses(static_cast<size_t>(rows)), expected_logsumexp(labels.size());
  backend::cpu::cross_entropy_forward<float>(expected_losses.data(), expected_logsumexp.data(),
                                             wide.data(), labels.data(), rows, vocab_size);
  std::vector<float> losses(labels.size()), logsumexp(labels.size());
  emulated::cross_entropy_forward<bfloat16>(losses.data(), logsumexp.data(), logits.data(),
                                            labels.data(), rows, vocab_size, nullptr);
  check_close(losses, expected_losses, 1e-5, 1e-5, "losses");
  check_close(logsumexp, expected_logsumexp, 1e-5, 1e-5, "logsumexp");

  // The backward from the forward's log-sum-exp, at a scale read from memory.
  const double stored_scale = 0.125;
  std::vector<bfloat16> dlogits(logits.size());
  emulated::cross_entropy_backward<bfloat16>(dlogits.data(), logits.data(), logsumexp.data(),
                                             labels.data(), 1.0F, &stored_scale, rows, vocab_size,
                                             0, nullptr);
  std::vector<float> expected_dlogits(wide.size());
  backend::cpu::cross_entropy_backward<float>(expected_dlogits.data(), wide.data(),
                                              expected_logsumexp.data(), labels.data(), 0.125F,
                                              rows, vocab_size, 0);
  check_close(widened(dlogits), expected_dlogits, 1e-7, 1.0 / 128, "dlogits");

  // Each shard's partial (its rows' log-sum-exp, the label's logit where the shard has it),
  // combined: the whole vocabulary's loss.
  std::vector<float> parts(static_cast<size_t>(2 * rows)), target(static_cast<size_t>(rows), 0);
  for (int64_t k = 0; k < 2; ++k) {
    const int64_t start = k * shard, columns = k == 0 ? shard : vocab_size - shard;
    std::vector<bfloat16> shard_logits(static_cast<size_t>(rows * columns));
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < columns; ++c) {
        shard_logits[static_cast<size_t>(r * columns + c)] =
            logits[static_cast<size_t>(r * vocab_size + start + c)];
      }
    }
    std::vector<float> target_part(static_cast<size_t>(rows));
    emulated::vocab_parallel_cross_entropy_partial<bfloat16>(
        parts.data() + k * rows, target_part.data(), shard_logits.data(), labels.data(), rows,
        columns, start, nullptr);
    for (size_t r = 0; r < target.size(); ++r) target[r] += target_part[r];
  }
  std::vector<float> combined_losses(labels.size()), combined_logsumexp(labels.size());
  emulated::vocab_parallel_cross_entropy_combine(combined_losses.data(), combined_logsumexp.data(),
                                                 parts.data(), target.data(), labels.data(), rows,
                                                 2, nullptr);
  check_close(combined_losses, expected_losses, 1e-5, 1e-5, "combined losses");
  check_close(combined_logsumexp, expected_logsumexp, 1e-5, 1e-5, "combined logsumexp");
}

namespace {

// LayerNorm (or RMSNorm: no mean, no bias) of rows × channels with the residual add fused in
// (input = residual + branch, written to `sum`, which is the input the ops are given, as the
// model gives them), then its backward twice: overwriting dinput,
// then accumulating into it, dweight and dbias accumulating over both.
template <typename S, bool kRms>
void check_norm(int64_t channels) {
  CAPTURE(channels);
  CAPTURE(kRms);
  const bool bf16 = std::is_same_v<S, bfloat16>;
  CAPTURE(bf16);
  const int64_t rows = 5;
  const size_t count = static_cast<size_t>(rows * channels), width = static_cast<size_t>(channels);
  const std::vector<S> residual = as_element<S>(random_values(count, 1, 1));
  const std::vector<S> branch = as_element<S>(random_values(count, 2, 0.5F));
  const std::vector<S> weight = as_element<S>(random_values(width, 3, 0.3F));
  const std::vector<S> bias = as_element<S>(random_values(width, 4, 0.1F));
  const std::vector<S> doutput = as_element<S>(random_values(count, 5, 1));
  const float epsilon = 1e-5F;
  const float weight_offset = 1.0F;  // --apply-layernorm-1p's zero-centred gamma

  std::vector<S> output(count), sum(count), dinput(count);
  std::vector<float> mean(static_cast<size_t>(rows)), rstd(mean.size());
  std::vector<float> dweight(width, 0.5F), dbias(width, -0.25F);
  const ResidualAdd<S> fused{sum.data(), residual.data(), branch.data()};
  std::vector<float> scratch;
  if constexpr (kRms) {
    emulated::rmsnorm_forward<S>(output.data(), rstd.data(), sum.data(), weight.data(), epsilon,
                                 rows, channels, nullptr, fused);
    scratch.resize(static_cast<size_t>(emulated::rmsnorm_backward_scratch_floats(rows, channels)));
    for (const InputGradient mode : {InputGradient::overwrite, InputGradient::accumulate}) {
      emulated::rmsnorm_backward<S>(dinput.data(), dweight.data(), doutput.data(), sum.data(),
                                    weight.data(), rstd.data(), rows, channels, scratch.data(),
                                    nullptr, mode);
    }
  } else {
    emulated::layernorm_forward<S>(output.data(), mean.data(), rstd.data(), sum.data(),
                                   weight.data(), bias.data(), weight_offset, epsilon, rows,
                                   channels, nullptr, fused);
    scratch.resize(
        static_cast<size_t>(emulated::layernorm_backward_scratch_floats(rows, channels)));
    for (const InputGradient mode : {InputGradient::overwrite, InputGradient::accumulate}) {
      emulated::layernorm_backward<S>(dinput.data(), dweight.data(), dbias.data(), doutput.data(),
                                      sum.data(), weight.data(), weight_offset, mean.data(),
                                      rstd.data(), rows, channels, scratch.data(), nullptr, mode);
    }
  }

  // The CPU twin on the same values in float.
  const std::vector<float> wide_residual = widened(residual), wide_branch = widened(branch);
  const std::vector<float> wide_weight = widened(weight), wide_bias = widened(bias);
  const std::vector<float> wide_doutput = widened(doutput);
  std::vector<float> expected_output(count), expected_sum(count), expected_dinput(count);
  std::vector<float> expected_mean(mean.size()), expected_rstd(mean.size());
  std::vector<float> expected_dweight(width, 0.5F), expected_dbias(width, -0.25F);
  // The sum in float; the norm of the sum as the GPU stored it (rounded to S), which is what
  // its forward reads back and its backward reads, as the model's ops do.
  for (size_t i = 0; i < count; ++i) expected_sum[i] = wide_residual[i] + wide_branch[i];
  const std::vector<float> stored_sum = widened(sum);
  if constexpr (kRms) {
    backend::cpu::rmsnorm_forward<float>(expected_output.data(), expected_rstd.data(),
                                         stored_sum.data(), wide_weight.data(), epsilon, rows,
                                         channels);
  } else {
    backend::cpu::layernorm_forward<float>(
        expected_output.data(), expected_mean.data(), expected_rstd.data(), stored_sum.data(),
        wide_weight.data(), wide_bias.data(), weight_offset, epsilon, rows, channels);
  }
  for (const InputGradient mode : {InputGradient::overwrite, InputGradient::accumulate}) {
    if constexpr (kRms) {
      backend::cpu::rmsnorm_backward<float>(expected_dinput.data(), expected_dweight.data(),
                                            wide_doutput.data(), stored_sum.data(),
                                            wide_weight.data(), rstd.data(), rows, channels, mode);
    } else {
      backend::cpu::layernorm_backward<float>(expected_dinput.data(), expected_dweight.data(),
                                              expected_dbias.data(), wide_doutput.data(),
                                              stored_sum.data(), wide_weight.data(), weight_offset,
                                              mean.data(), rstd.data(), rows, channels, mode);
    }
  }
  const double tolerance = output_tolerance<S>();
  check_close(widened(sum), expected_sum, 1e-7, tolerance, "residual + branch");
  check_close(widened(output), expected_output, 1e-6, tolerance, "output");
  check_close(rstd, expected_rstd, 1e-6, 1e-5, "rstd");
  if constexpr (!kRms) check_close(mean, expected_mean, 1e-6, 1e-5, "mean");
  check_close(widened(dinput), expected_dinput, 1e-5, tolerance, "dinput");
  check_close(dweight, expected_dweight, 1e-5, 1e-5, "dweight");
  if constexpr (!kRms) check_close(dbias, expected_dbias, 1e-5, 1e-5, "dbias");
}

}  // namespace

TEST_CASE(
    "LayerNorm and RMSNorm with the residual add, forward and backward, under emulation "
    "give their CPU twins' results") {
  // 64: whole packs; 50: the scalar path; 1100: rows longer than a block's threads.
  for (const int64_t channels : {int64_t{64}, int64_t{50}, int64_t{1100}}) {
    check_norm<float, false>(channels);
    check_norm<bfloat16, false>(channels);
    check_norm<float, true>(channels);
    check_norm<bfloat16, true>(channels);
  }
}
