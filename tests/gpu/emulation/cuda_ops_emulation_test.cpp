// The memory-bound CUDA ops of every training step (backend/ops: the fused classifier and the
// cross entropy's other kernels, LayerNorm and RMSNorm with the residual add fused in, forward
// and backward) run on the CPU through their own host side, each launch's blocks under
// warp_emulator.hpp (extract_cuda_ops.py rewrote the .cu files as host C++), against their CPU
// twins on the same inputs. Sizes cover the 16-byte packs and the scalar path (a row length the
// pack does not divide), ignored labels and labels at the vocabulary's ends, a scale read from
// device memory (a captured step's), two vocabulary shards combined, and the backward's
// accumulating mode; then the embedding (a frequent token's positions over several warps, a
// vocabulary shard), AdamW with the step's clipping decision and its bf16 working copy, the
// step's scalars, the reductions, scale and conversions, the elementwise GELU, SwiGLU,
// RoPE, residual and dropout ops, and the CUDA-core attention (training's, with and without
// dropout, and serving's over a key/value cache). Where CI has no GPU this is what checks the
// kernels' indexing, reductions and barriers; tests/gpu/ops_test.cpp checks them on a GPU.
#include <cuda_runtime.h>
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "gpu/emulation/warp_emulator.hpp"
// A launch is checked by CUDA_CHECK(cudaGetLastError()); an emulated one ran on the host and
// left no error behind (the runtime, with no GPU here, would report its absence instead).
#define cudaGetLastError() (::cudaSuccess)
// The attention kernels' opt-in to more than 48 KiB of shared memory: the emulated block gets
// the launch's bytes whatever they are.
#define cudaFuncSetAttribute(kernel, attribute, value) \
  ((void)(kernel), (void)(attribute), (void)(value), ::cudaSuccess)
// dropout's copy when inactive: the emulated device's memory is the host's.
#define cudaMemcpyAsync(to, from, bytes, kind, stream) \
  (std::memcpy((to), (from), (bytes)), (void)(kind), (void)(stream), ::cudaSuccess)
#include "cuda_ops.inc"

using backend::bfloat16;
using backend::InputGradient;
using backend::ResidualAdd;

namespace emulated = backend::cuda_emulated::all;

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
  return std::is_same_v<S, bfloat16> ? 1.0 / 256 : 2e-6;
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
  check_close(widened(dlogits), expected_dlogits, 1e-7, 1.0 / 256, "dlogits");

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

// The block-wide reductions again with warp 0 run until it waits at a block barrier before
// warp 1 starts (warp_emulator.hpp's Schedule::lowest_first): a warp reading a neighbour's
// partial sums before the barrier that publishes them reads NaN there, which the default order,
// the warps a warp barrier apart, may not show.
TEST_CASE("the classifier and the norms under emulation with warp 0 run ahead of the others") {
  const warp_emulator::ScopedOrder order(warp_emulator::Schedule::lowest_first);
  check_fused_classifier<float>(1000, false);
  check_fused_classifier<bfloat16>(777, true);
  check_norm<bfloat16, false>(1100);
  check_norm<float, true>(64);
}

TEST_CASE(
    "the embedding's CUDA kernels under emulation give their CPU twins' rows and "
    "gradients, a frequent token's positions included") {
  const int64_t batch = 2, seq = 6, rows = batch * seq;
  // Token 7 at seven positions (the backward walks a token's positions over several warps),
  // token 3 twice, and on the shard [5, 20) two tokens that are not its (zero rows there).
  const std::vector<int32_t> tokens = {7, 3, 7, 7, 12, 7, 2, 7, 3, 19, 7, 7};
  for (const int64_t hidden : {int64_t{40}, int64_t{36}}) {  // whole bf16 packs, and not
    for (const int64_t vocab_start : {int64_t{0}, int64_t{5}}) {
      CAPTURE(hidden);
      CAPTURE(vocab_start);
      const int64_t vocab = 20 - vocab_start;
      const std::vector<bfloat16> word =
          as_element<bfloat16>(random_values(static_cast<size_t>(vocab * hidden), 11, 1));
      const std::vector<bfloat16> position =
          as_element<bfloat16>(random_values(static_cast<size_t>(seq * hidden), 12, 1));
      std::vector<bfloat16> output(static_cast<size_t>(rows * hidden));
      emulated::embedding_forward<bfloat16>(output.data(), tokens.data(), word.data(),
                                            position.data(), batch, seq, hidden, vocab_start, vocab,
                                            nullptr);
      std::vector<float> expected(output.size());
      const std::vector<float> wide_word = widened(word), wide_position = widened(position);
      backend::cpu::embedding_forward<float>(expected.data(), tokens.data(), wide_word.data(),
                                             wide_position.data(), batch, seq, hidden, vocab_start,
                                             vocab);
      check_close(widened(output), expected, 1e-7, 1.0 / 256, "embedding output");

      std::vector<int32_t> index(static_cast<size_t>(backend::token_index_elements(rows)));
      backend::index_tokens(tokens.data(), rows, index.data());
      const std::vector<bfloat16> doutput =
          as_element<bfloat16>(random_values(static_cast<size_t>(rows * hidden), 13, 1));
      std::vector<float> dword(wide_word.size(), 0.5F), dposition(wide_position.size(), -1.0F);
      emulated::embedding_backward<bfloat16>(dword.data(), dposition.data(), doutput.data(),
                                             index.data(), batch, seq, hidden, vocab_start, vocab,
                                             nullptr);
      std::vector<float> expected_dword(dword.size(), 0.5F);
      std::vector<float> expected_dposition(dposition.size(), -1.0F);
      const std::vector<float> wide_doutput = widened(doutput);
      backend::cpu::embedding_backward<float>(expected_dword.data(), expected_dposition.data(),
                                              wide_doutput.data(), index.data(), batch, seq, hidden,
                                              vocab_start, vocab);
      check_close(dword, expected_dword, 1e-6, 1e-6, "dword");
      check_close(dposition, expected_dposition, 1e-6, 1e-6, "dposition");
    }
  }
}

TEST_CASE(
    "AdamW's CUDA kernel under emulation gives its CPU twin's update, clipped by the "
    "step's decision, with the bf16 working copy written in the same pass") {
  const int64_t count = 1000;
  const std::vector<backend::AdamWGroup> groups = {{0, 600, true}, {600, 400, false}};
  backend::AdamWCoefficients coefficients;
  coefficients.step_size = 1e-3F / (1 - 0.9F * 0.9F);  // the second step's
  coefficients.inverse_sqrt_correction2 = 1 / std::sqrt(1 - 0.999F * 0.999F);
  coefficients.decay = 1e-3F * 0.1F;
  // The decision from a norm of 4 against --clip-grad 1: the gradients scaled by 1/(4 + 1e-6).
  const double loss_total = 2.0, sum_of_squares = 16.0;
  double control[2] = {};
  backend::cpu::decide_step(control, &loss_total, &sum_of_squares, 1.0);
  REQUIRE(control[0] < 1.0);
  const std::vector<float> gradients = random_values(static_cast<size_t>(count), 21, 0.5F);
  std::vector<float> master = random_values(static_cast<size_t>(count), 22, 1);
  std::vector<float> exp_avg = random_values(static_cast<size_t>(count), 23, 0.01F);
  std::vector<float> exp_avg_sq(static_cast<size_t>(count));
  for (size_t i = 0; i < exp_avg_sq.size(); ++i) exp_avg_sq[i] = 1e-4F * (1 + i % 7);
  std::vector<float> expected_master = master, expected_exp_avg = exp_avg;
  std::vector<float> expected_exp_avg_sq = exp_avg_sq;
  std::vector<bfloat16> weights(static_cast<size_t>(count));
  emulated::adamw_update<bfloat16>(master.data(), weights.data(), gradients.data(), exp_avg.data(),
                                   exp_avg_sq.data(), count, &coefficients, control, groups,
                                   nullptr);
  backend::cpu::adamw_update(expected_master.data(), gradients.data(), expected_exp_avg.data(),
                             expected_exp_avg_sq.data(), count, &coefficients, control, groups);
  check_close(master, expected_master, 1e-7, 1e-6, "master weights");
  check_close(exp_avg, expected_exp_avg, 1e-9, 1e-6, "exp_avg");
  check_close(exp_avg_sq, expected_exp_avg_sq, 1e-12, 1e-6, "exp_avg_sq");
  // The working copy is the new master weights, each rounded once.
  check_close(widened(weights), widened(as_element<bfloat16>(master)), 0, 0, "bf16 weights");
  // A skipped step (a non-finite norm) changes nothing.
  const double infinite = INFINITY;
  backend::cpu::decide_step(control, &loss_total, &infinite, 1.0);
  const std::vector<float> before = master;
  emulated::adamw_update<bfloat16>(master.data(), weights.data(), gradients.data(), exp_avg.data(),
                                   exp_avg_sq.data(), count, &coefficients, control, groups,
                                   nullptr);
  CHECK(master == before);
}

TEST_CASE("the step's scalars under emulation are their CPU twins' bits") {
  // decide_step: an unclipped step, a clipped one, a non-finite loss, a non-finite norm.
  struct Decision {
    double loss, sum_of_squares, max_norm;
  };
  for (const Decision d : {Decision{2.0, 0.25, 1.0}, Decision{2.0, 16.0, 1.0},
                           Decision{NAN, 0.25, 1.0}, Decision{2.0, INFINITY, 0.0}}) {
    CAPTURE(d.sum_of_squares);
    double control[2] = {-1, -1}, expected[2] = {-1, -1};
    emulated::decide_step(control, &d.loss, &d.sum_of_squares, d.max_norm, nullptr);
    backend::cpu::decide_step(expected, &d.loss, &d.sum_of_squares, d.max_norm);
    CHECK(control[0] == expected[0]);
    CHECK(control[1] == expected[1]);
  }
  // accumulate_loss: the mean in float or double, weighted by the count or not, the count
  // given or read from memory (a captured step's).
  const double micro_batch_total = 7.3;
  const double stored_count = 3;
  for (const bool weighted : {false, true}) {
    for (const bool mean_in_float : {false, true}) {
      for (const bool stored : {false, true}) {
        double total = 1.5, expected = 1.5;
        emulated::accumulate_loss(&total, &micro_batch_total, stored ? 99 : 3,
                                  stored ? &stored_count : nullptr, weighted, mean_in_float,
                                  nullptr);
        backend::cpu::accumulate_loss(&expected, &micro_batch_total, 3, weighted, mean_in_float);
        CHECK(total == expected);
      }
    }
  }
  double total = 0.25;
  const double value = 0.5;
  emulated::add(&total, &value, nullptr);
  CHECK(total == 0.75);
}

TEST_CASE(
    "the reductions, the scale and the conversions under emulation give their CPU twins' "
    "results") {
  const int64_t count = 5003;  // several partial blocks, and a tail that is not a whole pack
  std::vector<float> values = random_values(static_cast<size_t>(count), 31, 2);
  for (size_t i = 0; i < values.size(); i += 17) values[i] = 0;
  const std::vector<bfloat16> bf16_values = as_element<bfloat16>(values);
  const std::vector<float> wide = widened(bf16_values);
  std::vector<double> partials(static_cast<size_t>(backend::cuda::kReductionPartials));
  const auto check_reduction = [&](auto run_emulated, auto run_cpu, const char* what) {
    double total = -1, expected = -1;
    run_emulated(&total);
    run_cpu(&expected);
    CAPTURE(what);
    CHECK(total == doctest::Approx(expected).epsilon(1e-12));
  };
  check_reduction(
      [&](double* t) {
        emulated::sum<bfloat16>(t, partials.data(), bf16_values.data(), count, nullptr);
      },
      [&](double* t) { backend::cpu::sum<float>(t, wide.data(), count); }, "sum");
  check_reduction(
      [&](double* t) {
        emulated::sum_of_squares<float>(t, partials.data(), values.data(), count, nullptr);
      },
      [&](double* t) { backend::cpu::sum_of_squares<float>(t, values.data(), count); },
      "sum of squares");
  check_reduction(
      [&](double* t) {
        emulated::count_zeros<bfloat16>(t, partials.data(), bf16_values.data(), count, 1.0, nullptr,
                                        nullptr);
      },
      [&](double* t) { backend::cpu::count_zeros<float>(t, wide.data(), count); }, "zeros");
  // After clipping by a stored factor of 1e-8: the values of 3e-38 underflow to 0 and count.
  std::vector<float> tiny = values;
  for (size_t i = 3; i < tiny.size(); i += 23) tiny[i] = 3e-38F;
  const double clipping_factor = 1e-8;
  double clipped_zeros = -1, plain_zeros = -1;
  backend::cpu::count_zeros<float>(&plain_zeros, tiny.data(), count);
  check_reduction(
      [&](double* t) {
        emulated::count_zeros<float>(t, partials.data(), tiny.data(), count, 5.0, &clipping_factor,
                                     nullptr);
        clipped_zeros = *t;
      },
      [&](double* t) { backend::cpu::count_zeros<float>(t, tiny.data(), count, 1e-8); },
      "zeros after clipping");
  CHECK(clipped_zeros > plain_zeros);

  std::vector<float> scaled = values, expected_scaled = values;
  const double stored_factor = 0.375;
  emulated::scale<float>(scaled.data(), 5.0, &stored_factor, count, nullptr);
  backend::cpu::scale<float>(expected_scaled.data(), 0.375, count);
  CHECK(scaled == expected_scaled);

  // float → bf16 → float: the host's rounding to nearest even, and exact widening.
  std::vector<bfloat16> narrowed(values.size());
  emulated::convert(narrowed.data(), values.data(), count, nullptr);
  std::vector<float> back(values.size());
  emulated::convert(back.data(), narrowed.data(), count, nullptr);
  CHECK(back == wide);
}

TEST_CASE(
    "GELU, SwiGLU, RoPE, the residual add and dropout under emulation give their CPU "
    "twins' results") {
  const int64_t rows = 6, features = 20;  // 20: not a whole bf16 pack per row
  const size_t count = static_cast<size_t>(rows * 2 * features);
  const std::vector<bfloat16> input = as_element<bfloat16>(random_values(count, 41, 2));
  const std::vector<bfloat16> doutput = as_element<bfloat16>(random_values(count, 42, 1));
  const std::vector<float> wide = widened(input), wide_doutput = widened(doutput);
  const int64_t n = static_cast<int64_t>(count);
  {
    std::vector<bfloat16> output(count), dinput(count);
    emulated::gelu_forward<bfloat16>(output.data(), input.data(), n, nullptr);
    emulated::gelu_backward<bfloat16>(dinput.data(), doutput.data(), input.data(), n, nullptr);
    std::vector<float> expected(count), expected_dinput(count);
    backend::cpu::gelu_forward<float>(expected.data(), wide.data(), n);
    backend::cpu::gelu_backward<float>(expected_dinput.data(), wide_doutput.data(), wide.data(), n);
    check_close(widened(output), expected, 1e-6, 1.0 / 256, "gelu");
    check_close(widened(dinput), expected_dinput, 1e-6, 1.0 / 256, "gelu backward");
  }
  {
    const size_t half = count / 2;
    std::vector<bfloat16> output(half), dinput(count);
    const std::vector<bfloat16> dhalf(doutput.begin(), doutput.begin() + static_cast<long>(half));
    emulated::swiglu_forward<bfloat16>(output.data(), input.data(), rows, features, nullptr);
    emulated::swiglu_backward<bfloat16>(dinput.data(), dhalf.data(), input.data(), rows, features,
                                        nullptr);
    std::vector<float> expected(half), expected_dinput(count);
    const std::vector<float> wide_dhalf = widened(dhalf);
    backend::cpu::swiglu_forward<float>(expected.data(), wide.data(), rows, features);
    backend::cpu::swiglu_backward<float>(expected_dinput.data(), wide_dhalf.data(), wide.data(),
                                         rows, features);
    check_close(widened(output), expected, 1e-6, 1.0 / 256, "swiglu");
    check_close(widened(dinput), expected_dinput, 1e-6, 1.0 / 256, "swiglu backward");
  }
  {
    // Two sequences of 3 positions, 2 heads of 8 with 6 rotated, rows of 20 (one head's
    // worth of other columns after them).
    const int64_t batch = 2, seq = 3, heads = 2, head_dim = 8, rotary = 6, stride = 20;
    std::vector<float> cos(static_cast<size_t>(seq * rotary / 2)), sin(cos.size());
    std::vector<float> expected_cos(cos.size()), expected_sin(cos.size());
    emulated::rope_tables(cos.data(), sin.data(), seq, rotary, 10000.0, {}, nullptr);
    backend::cpu::rope_tables<float>(expected_cos.data(), expected_sin.data(), seq, rotary, 10000.0,
                                     {});
    check_close(cos, expected_cos, 1e-6, 1e-5, "rope cos");
    check_close(sin, expected_sin, 1e-6, 1e-5, "rope sin");
    const size_t elements = static_cast<size_t>(batch * seq * stride);
    const std::vector<bfloat16> x = as_element<bfloat16>(random_values(elements, 43, 1));
    std::vector<bfloat16> output = x, dinput = x;
    emulated::rope_forward<bfloat16>(output.data(), x.data(), cos.data(), sin.data(), batch, seq,
                                     heads, head_dim, rotary, stride, nullptr);
    emulated::rope_backward<bfloat16>(dinput.data(), x.data(), cos.data(), sin.data(), batch, seq,
                                      heads, head_dim, rotary, stride, nullptr);
    std::vector<float> expected = widened(x), expected_dinput = widened(x);
    const std::vector<float> wide_x = widened(x);
    backend::cpu::rope_forward<float>(expected.data(), wide_x.data(), cos.data(), sin.data(), batch,
                                      seq, heads, head_dim, rotary, stride);
    backend::cpu::rope_backward<float>(expected_dinput.data(), wide_x.data(), cos.data(),
                                       sin.data(), batch, seq, heads, head_dim, rotary, stride);
    check_close(widened(output), expected, 1e-6, 1.0 / 256, "rope");
    check_close(widened(dinput), expected_dinput, 1e-6, 1.0 / 256, "rope backward");
  }
  {
    std::vector<bfloat16> sum(count);
    emulated::residual_forward<bfloat16>(sum.data(), input.data(), doutput.data(), n, nullptr);
    std::vector<float> expected(count);
    backend::cpu::residual_forward<float>(expected.data(), wide.data(), wide_doutput.data(), n);
    check_close(widened(sum), expected, 1e-7, 1.0 / 256, "residual");
  }
  {
    // The mask is a function of the key and the element's index on both twins: the same
    // elements dropped, the kept ones scaled by 1/(1 − p); a key read from memory, a slice's
    // first index, and p = 0's copy.
    const uint64_t stored_key = 0x5eed;
    for (const backend::Dropout dropout :
         {backend::Dropout{.probability = 0.25, .key = 99, .first_index = 0},
          backend::Dropout{
              .probability = 0.5, .key = 0, .first_index = 1000, .stored_key = &stored_key},
          backend::Dropout{}}) {
      CAPTURE(dropout.probability);
      std::vector<bfloat16> output(count), dinput(count);
      emulated::dropout_forward<bfloat16>(output.data(), input.data(), n, dropout, nullptr);
      emulated::dropout_backward<bfloat16>(dinput.data(), doutput.data(), n, dropout, nullptr);
      std::vector<float> expected(count), expected_dinput(count);
      backend::cpu::dropout_forward<float>(expected.data(), wide.data(), n, dropout);
      backend::cpu::dropout_backward<float>(expected_dinput.data(), wide_doutput.data(), n,
                                            dropout);
      check_close(widened(output), expected, 0, 1.0 / 256, "dropout");
      check_close(widened(dinput), expected_dinput, 0, 1.0 / 256, "dropout backward");
    }
  }
}

TEST_CASE(
    "the CUDA-core attention under emulation gives its CPU twin's output, log-sum-exp and "
    "gradients, and serving's cache attention its rows") {
  // 37 positions: not a whole number of tiles; 4 heads in 2 query groups (GQA).
  const backend::AttentionShape shape{
      .batch_size = 2, .seq_length = 37, .hidden_size = 64, .num_heads = 4, .num_query_groups = 2};
  const int64_t rows = shape.batch_size * shape.seq_length;
  const size_t qkv_count = static_cast<size_t>(rows * shape.qkv_row_width());
  const size_t out_count = static_cast<size_t>(rows * shape.hidden_size);
  const std::vector<bfloat16> qkv = as_element<bfloat16>(random_values(qkv_count, 51, 1));
  const std::vector<bfloat16> doutput = as_element<bfloat16>(random_values(out_count, 52, 1));
  const std::vector<float> wide_qkv = widened(qkv), wide_doutput = widened(doutput);
  for (const backend::Dropout dropout :
       {backend::Dropout{}, backend::Dropout{.probability = 0.2, .key = 7}}) {
    CAPTURE(dropout.probability);
    std::vector<bfloat16> output(out_count), dqkv(qkv_count);
    std::vector<float> logsumexp(static_cast<size_t>(rows * shape.num_heads));
    emulated::attention_forward<bfloat16>(output.data(), logsumexp.data(), qkv.data(), shape,
                                          dropout, nullptr);
    emulated::attention_backward<bfloat16>(dqkv.data(), doutput.data(), qkv.data(), output.data(),
                                           logsumexp.data(), shape, dropout, nullptr);
    std::vector<float> expected(out_count), expected_logsumexp(logsumexp.size());
    std::vector<float> expected_dqkv(qkv_count);
    backend::cpu::attention_forward<float>(expected.data(), expected_logsumexp.data(),
                                           wide_qkv.data(), shape, dropout);
    // The backward from the GPU's stored output and statistics, as the model's would run.
    const std::vector<float> stored_output = widened(output);
    backend::cpu::attention_backward<float>(expected_dqkv.data(), wide_doutput.data(),
                                            wide_qkv.data(), stored_output.data(), logsumexp.data(),
                                            shape, dropout);
    // The kernels compute in float from bf16 inputs: the outputs differ by their one rounding
    // to bf16 (2^-9 relative) and the sums' order.
    check_close(widened(output), expected, 1e-5, 1.0 / 256, "attention output");
    check_close(logsumexp, expected_logsumexp, 1e-5, 1e-5, "attention logsumexp");
    check_close(widened(dqkv), expected_dqkv, 1e-4, 1.0 / 256, "attention dqkv");
  }

  // Serving: three rows of two sequences (slots), at positions 0, 1 and 0 of the cache.
  const int64_t head_dim = shape.head_dim(), max_length = 4, slots_count = 2, cache_rows = 3;
  const std::vector<int32_t> slots = {0, 0, 1}, positions = {0, 1, 0};
  const size_t cache_count =
      static_cast<size_t>(slots_count * max_length * shape.num_query_groups * head_dim);
  const size_t step_count = static_cast<size_t>(cache_rows * shape.qkv_row_width());
  const std::vector<bfloat16> step_qkv(qkv.begin(), qkv.begin() + static_cast<long>(step_count));
  std::vector<bfloat16> key_cache(cache_count, backend::to_bfloat16(0));
  std::vector<bfloat16> value_cache = key_cache;
  std::vector<bfloat16> cache_output(static_cast<size_t>(cache_rows * shape.hidden_size));
  emulated::kv_cache_attention_forward<bfloat16>(
      cache_output.data(), key_cache.data(), value_cache.data(), step_qkv.data(), slots.data(),
      positions.data(), cache_rows, shape.num_heads, shape.num_query_groups, head_dim, max_length,
      nullptr);
  std::vector<float> expected_keys(cache_count, 0), expected_values(cache_count, 0);
  std::vector<float> expected_cache_output(cache_output.size());
  const std::vector<float> wide_step = widened(step_qkv);
  backend::cpu::kv_cache_attention_forward<float>(
      expected_cache_output.data(), expected_keys.data(), expected_values.data(), wide_step.data(),
      slots.data(), positions.data(), cache_rows, shape.num_heads, shape.num_query_groups, head_dim,
      max_length);
  check_close(widened(key_cache), expected_keys, 0, 0, "key cache");
  check_close(widened(value_cache), expected_values, 0, 0, "value cache");
  check_close(widened(cache_output), expected_cache_output, 1e-5, 1.0 / 256, "cache attention");
}
