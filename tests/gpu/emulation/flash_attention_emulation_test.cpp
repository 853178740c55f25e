// The tensor-core attention kernels (backend/ops/attention_flash_cuda.cu: forward, dK/dV, dQ)
// run on the CPU under warp_emulator.hpp, against an fp64 reference of attention.hpp's math
// (gpu/attention_reference.hpp): output, fp32 log-sum-exp and dqkv (overwritten: the buffer is
// NaN first). Sequence lengths around the 64-row tiles (1, 63, 65, 130), head dimensions 64
// and 128, multi-head, grouped and multi-query layouts, with and without dropout (the mask
// elements of ops/dropout.hpp), in bf16 and in fp16; one and two stages of tile buffers, the
// emulated cp.async landing at its wait (a read too early shows) or at once with warp 0 run
// ahead (a copy into a buffer another warp still reads shows). Inputs are values of the element
// type, so the reference sees what the kernels see; the tolerance covers P and dS rounded to that
// type inside the kernels and the rounded outputs. Where CI has no GPU this is what checks the
// kernels' tile logic; tests/gpu/attention_test.cpp checks them on a GPU.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <sstream>
#include <type_traits>
#include <vector>

#include "gpu/attention_reference.hpp"
#include "gpu/emulation/warp_emulator.hpp"
// warp_emulator.hpp first: the kernels below use its threadIdx, barriers and mma.
#include "backend/ops/attention.hpp"

namespace backend::cuda {
namespace {
#include "flash_attention_kernels.inc"
}  // namespace
}  // namespace backend::cuda

namespace {

constexpr double kBf16Tolerance = 1e-2;
constexpr double kFp16Tolerance = 2e-3;

// float → E, rounded to nearest even.
template <typename E>
E to_element(float value) {
  if constexpr (std::is_same_v<E, __half>) {
    return __float2half_rn(value);
  } else {
    return __float2bfloat16_rn(value);
  }
}

struct Shape {
  int64_t batch, seq, heads, groups, head_dim;
  double dropout;
  bool stored_key = false;  // the kernels read the dropout key from memory (a captured step's)
  int stages = 2;           // tile buffers: 2 (the next tile copied in under the products) or 1
  // When the emulated cp.async writes: at the wait (a read before it shows) or at once (a copy
  // into a buffer other threads still read shows).
  warp_emulator::CopyTiming copies = warp_emulator::CopyTiming::at_wait;
  // Copies at once are checked with warp 0 running ahead of the others (warp_emulator.hpp).
  warp_emulator::Schedule schedule() const {
    return copies == warp_emulator::CopyTiming::at_issue ? warp_emulator::Schedule::lowest_first
                                                         : warp_emulator::Schedule::round_robin;
  }
};

// max |actual − expected| / max |expected|, NaN counting as infinitely far.
void check_close(const std::string& what, const std::vector<float>& actual,
                 const std::vector<double>& expected, double tolerance) {
  REQUIRE(actual.size() == expected.size());
  double scale = 1e-6, worst = 0;
  size_t worst_index = 0;
  for (double value : expected) scale = std::max(scale, std::fabs(value));
  for (size_t i = 0; i < actual.size(); ++i) {
    const double error = std::isnan(actual[i]) ? std::numeric_limits<double>::infinity()
                                               : std::fabs(actual[i] - expected[i]);
    if (!(error <= worst)) {
      worst = error;
      worst_index = i;
    }
  }
  INFO(what << ": max error " << worst / scale << " (normalised) at " << worst_index << ": got "
            << actual[worst_index] << ", expected " << expected[worst_index]);
  CHECK(worst / scale <= tolerance);
}

// Runs the three kernels on E inputs; `tolerance` bounds the output's and dqkv's normalised error.
template <int HD, typename E>
void check_kernels(const Shape& s, double tolerance) {
  using namespace backend::cuda;
  const int64_t T = s.seq;
  const int64_t width = (s.heads + 2 * s.groups) * HD, hidden = s.heads * HD;
  std::mt19937 generator(static_cast<uint32_t>(T * 131 + HD));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto representable_values = [&](int64_t count) {
    std::vector<float> values(static_cast<size_t>(count));
    for (auto& value : values) {
      value = warp_emulator::element_value(to_element<E>(normal(generator)));
    }
    return values;
  };
  const std::vector<float> qkv = representable_values(s.batch * T * width);
  const std::vector<float> dout = representable_values(s.batch * T * hidden);
  const backend::Dropout dropout{s.dropout, backend::dropout_key(1, 2, 3, 4)};
  const gpu_test::AttentionReference expected = gpu_test::attention_reference(
      {s.batch, T, s.heads, s.groups, HD}, qkv, dout, [&](int64_t pair, int64_t i, int64_t j) {
        if (!dropout.active()) return 1.0;
        const auto index = static_cast<uint64_t>((pair * T + i) * T + j);
        return backend::dropout_keep(dropout.key, index, dropout.threshold())
                   ? 1.0 / (1.0 - dropout.probability)
                   : 0.0;
      });
  // The kernels' mask: the key by value, or read through a pointer with another value beside
  // it (the emulated kernels run on the CPU, so host memory stands for the device's).
  const uint64_t key_memory = dropout.key;
  backend::Dropout kernel_dropout = dropout;
  if (s.stored_key) {
    kernel_dropout.key = ~dropout.key;
    kernel_dropout.stored_key = &key_memory;
  }

  auto to_elements = [](const std::vector<float>& values) {
    std::vector<E> converted(values.size());
    for (size_t i = 0; i < values.size(); ++i) converted[i] = to_element<E>(values[i]);
    return converted;
  };
  const std::vector<E> x = to_elements(qkv), dy = to_elements(dout);
  const E nan = to_element<E>(std::numeric_limits<float>::quiet_NaN());
  std::vector<E> output(static_cast<size_t>(s.batch * T * hidden), nan);
  std::vector<E> dqkv(x.size(), nan);
  std::vector<float> logsumexp(static_cast<size_t>(s.batch * s.heads * T),
                               std::numeric_limits<float>::quiet_NaN());
  const FlashShape shape = make_flash_shape("flash attention (emulated)",
                                            {.batch_size = s.batch,
                                             .seq_length = T,
                                             .hidden_size = hidden,
                                             .num_heads = s.heads,
                                             .num_query_groups = s.groups},
                                            kernel_dropout);
  const auto tiles = static_cast<unsigned>((T + kRows - 1) / kRows);
  const auto pairs = static_cast<unsigned>(s.batch * s.heads);
  const auto group_units = static_cast<unsigned>(s.batch * s.groups);
  // The shared memory each launch gets is what the op's launch gives: the kernels' own carves.
  const int stages = s.stages;
  {
    const warp_emulator::ScopedOrder order(s.schedule(), s.copies);
    warp_emulator::launch(tiles, pairs, shared_bytes_of(carve_forward<HD, E>, stages), [&] {
      flash_forward_kernel<HD>(output.data(), logsumexp.data(), x.data(), shape, stages);
    });
    warp_emulator::launch(tiles, group_units, shared_bytes_of(carve_dkdv<HD, E>, stages), [&] {
      flash_dkdv_kernel<HD>(dqkv.data(), dy.data(), x.data(), output.data(), logsumexp.data(),
                            s.groups, shape, stages);
    });
    warp_emulator::launch(tiles, pairs, shared_bytes_of(carve_dq<HD, E>, stages), [&] {
      flash_dq_kernel<HD>(dqkv.data(), dy.data(), x.data(), output.data(), logsumexp.data(), shape,
                          stages);
    });
  }

  auto to_float = [](const std::vector<E>& values) {
    std::vector<float> converted(values.size());
    for (size_t i = 0; i < values.size(); ++i) {
      converted[i] = warp_emulator::element_value(values[i]);
    }
    return converted;
  };
  std::ostringstream what;
  what << (std::is_same_v<E, __half> ? "fp16" : "bf16") << " B " << s.batch << " T " << T << " NH "
       << s.heads << " NG " << s.groups << " HD " << HD << " dropout " << s.dropout
       << (s.stored_key ? " stored key" : "") << " stages " << s.stages
       << (s.copies == warp_emulator::CopyTiming::at_issue ? " copies at issue, warp 0 first" : "");
  check_close(what.str() + " output", to_float(output), expected.output, tolerance);
  check_close(what.str() + " logsumexp", logsumexp, expected.logsumexp, 1e-5);
  check_close(what.str() + " dqkv", to_float(dqkv), expected.dqkv, tolerance);
}

}  // namespace

TEST_CASE("the tensor-core attention kernels, emulated on the CPU, match an fp64 reference") {
  // Small enough for CI's two cores (each emulated block is 128 threads meeting at barriers):
  // one to three tiles, both head dimensions past one tile, MQA with two heads per group.
  // bf16 outputs carry 2^-9 relative rounding of their own, fp16's 2^-12; P and dS are rounded
  // inside the kernels too.
  // Three tiles and two heads per group (the dK/dV kernel's steps cross heads) also with one
  // stage, and with the copies landing at once.
  constexpr auto at_issue = warp_emulator::CopyTiming::at_issue;
  for (const Shape s :
       {Shape{1, 1, 2, 2, 64, 0.0}, Shape{2, 63, 4, 2, 64, 0.0}, Shape{1, 65, 2, 2, 128, 0.1},
        Shape{1, 130, 2, 1, 64, 0.1}, Shape{1, 130, 2, 1, 128, 0.0},
        Shape{1, 65, 2, 1, 64, 0.1, true}, Shape{1, 130, 2, 1, 64, 0.0, false, 1},
        Shape{1, 130, 2, 1, 64, 0.0, false, 2, at_issue},
        Shape{1, 130, 2, 1, 64, 0.0, false, 1, at_issue}}) {
    if (s.head_dim == 64) {
      check_kernels<64, __nv_bfloat16>(s, kBf16Tolerance);
    } else {
      check_kernels<128, __nv_bfloat16>(s, kBf16Tolerance);
    }
  }
  // fp16: the same kernels with the f16 mma; one and two tiles, both head dimensions, dropout.
  for (const Shape s : {Shape{2, 63, 4, 2, 64, 0.1}, Shape{1, 65, 2, 1, 128, 0.0}}) {
    if (s.head_dim == 64) {
      check_kernels<64, __half>(s, kFp16Tolerance);
    } else {
      check_kernels<128, __half>(s, kFp16Tolerance);
    }
  }
}
