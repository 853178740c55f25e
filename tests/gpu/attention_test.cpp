// Causal GQA attention on the CUDA device against the CPU device: forward (output and the
// fp32 log-sum-exp) and backward (dqkv, overwritten), fp32, bf16 and fp16, head dimensions 8,
// 24, 64 and 128, multi-head, grouped and multi-query layouts, sequence lengths that are not
// multiples of the tile (1, 7, 129), with and without attention dropout (the same mask
// elements as the CPU twin), run to run identical. The key/value-cache attention of decoding
// too: the stored caches and the output, rows of several slots at several positions. And the
// tensor-core kernel of --attention-backend flash, bf16 and fp16 at head dimensions 64 and 128,
// and cuDNN's fused attention (--attention-backend fused): multi-head, multi-query and grouped
// layouts, head dimensions 64 and 128, its backward the same bits run to run, its refusals.
#include <doctest/doctest.h>

#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "backend/ops/attention.hpp"
#include "backend/ops/dropout.hpp"
#include "gpu/gpu_test_support.hpp"

using backend::ElementType;
using backend::View;
namespace ops = backend::ops;
using namespace gpu_test;

namespace {

struct Shape {
  int64_t batch, seq, heads, groups, head_dim;

  backend::AttentionShape geometry() const {
    return {.batch_size = batch,
            .seq_length = seq,
            .hidden_size = heads * head_dim,
            .num_heads = heads,
            .num_query_groups = groups};
  }
};

}  // namespace

TEST_CASE("attention on the CUDA device matches the CPU device (fp32, bf16, fp16, dropout)") {
  auto gpu = open_gpu_or_skip(/*cpu_stand_in_allowed=*/true);
  if (!gpu) return;
  for (const Shape s : {Shape{1, 1, 2, 2, 8}, Shape{2, 7, 4, 2, 24}, Shape{2, 129, 4, 1, 64},
                        Shape{1, 70, 2, 2, 128}, Shape{1, 33, 3, 3, 8}}) {
    // -1: p = 0.1 with its key in device memory (a captured step's).
    for (double probability : {0.0, 0.1, -1.0}) {
      const bool stored = probability < 0;
      if (stored) probability = 0.1;
      for (ElementType type : {ElementType::f32, ElementType::bf16, ElementType::f16}) {
        std::ostringstream what;
        what << "attention B " << s.batch << " T " << s.seq << " NH " << s.heads << " NG "
             << s.groups << " HD " << s.head_dim << " dropout " << probability
             << (stored ? " stored key" : "");
        const int64_t hidden = s.heads * s.head_dim;
        const int64_t width = (s.heads + 2 * s.groups) * s.head_dim;
        const backend::Dropout dropout{probability, backend::dropout_key(1, 2, 3, 4)};
        const auto qkv = representable(random_values(s.batch * s.seq * width, 21), type);
        const auto dout = representable(random_values(s.batch * s.seq * hidden, 22), type);
        // bf16 and fp16 also round the forward's output, which the backward's Δ = Σ dO·O reads.
        check_against_cpu(
            *gpu, what.str(), type, tolerance(type, 5e-5, 3e-2),
            [&](Tensors& t, ElementType dtype) {
              Device& device = t.device();
              const backend::Dropout mask = stored ? t.with_stored_key(dropout) : dropout;
              View x = t.input(qkv, dtype);
              View o = t.poisoned(s.batch * s.seq * hidden, dtype);
              // The log-sum-exp is fp32 on the GPU whatever the qkv type; the CPU keeps qkv's.
              View lse = t.poisoned(s.batch * s.heads * s.seq, ElementType::f32);
              ops::attention_forward(device, o, lse, x, s.geometry(), mask);
              View dx = t.poisoned(s.batch * s.seq * width, dtype);
              ops::attention_backward(device, dx, t.input(dout, dtype), x, o, lse, s.geometry(),
                                      mask);
              return Outputs{{"output", t.read(o)}, {"logsumexp", t.read(lse)},
                             {"dqkv", t.read(dx)}};
            });
      }
    }
  }
}

// --use-flash-attn's kernel (attention_flash_cuda.cu, mma.sync on tensor cores): bf16 and fp16
// only, so no CPU stand-in. Sequence lengths around its 64-row tiles, head dimensions 64 and 128,
// multi-head, grouped and multi-query layouts, batches of several sequences. The small case
// (two tiles, so the loops' barriers between tiles are exercised) is racecheck's: the sanitizer
// slows these kernels down by orders of magnitude.
namespace {

// The tensor-core kernels (ours, or cuDNN's with `probabilities` {0}) against the CPU twin.
// A probability of -1 is p = 0.1 with the key in device memory (a captured step's).
void check_16_bit_attention(Device& gpu, const std::vector<Shape>& shapes,
                            std::vector<double> probabilities = {0.0, 0.1, -1.0}) {
  for (const Shape& s : shapes) {
    for (double probability : probabilities) {
      const bool stored = probability < 0;
      if (stored) probability = 0.1;
      std::ostringstream what;
      what << "16-bit attention B " << s.batch << " T " << s.seq << " NH " << s.heads << " NG "
           << s.groups << " HD " << s.head_dim << " dropout " << probability
           << (stored ? " stored key" : "");
      const int64_t hidden = s.heads * s.head_dim;
      const int64_t width = (s.heads + 2 * s.groups) * s.head_dim;
      const backend::Dropout dropout{probability, backend::dropout_key(1, 2, 3, 4)};
      for (const ElementType type : {ElementType::bf16, ElementType::f16}) {
        const auto qkv = representable(random_values(s.batch * s.seq * width, 31), type);
        const auto dout = representable(random_values(s.batch * s.seq * hidden, 32), type);
        // P and dS enter their tensor-core products rounded to bf16 (fp16): the same 3e-2 as the
        // bf16 CUDA-core kernel above, which rounds only inputs and outputs, is the bound (fp16
        // rounds to 3 more bits: a quarter of it).
        const double bound = type == ElementType::bf16 ? 3e-2 : 7.5e-3;
        check_against_cpu(gpu, what.str(), type, bound, [&](Tensors& t, ElementType dtype) {
          Device& device = t.device();
          const backend::Dropout mask = stored ? t.with_stored_key(dropout) : dropout;
          View x = t.input(qkv, dtype);
          View o = t.poisoned(s.batch * s.seq * hidden, dtype);
          View lse = t.poisoned(s.batch * s.heads * s.seq, ElementType::f32);
          ops::attention_forward(device, o, lse, x, s.geometry(), mask);
          View dx = t.poisoned(s.batch * s.seq * width, dtype);
          ops::attention_backward(device, dx, t.input(dout, dtype), x, o, lse, s.geometry(), mask);
          return Outputs{
              {"output", t.read(o)}, {"logsumexp", t.read(lse)}, {"dqkv", t.read(dx)}};
        });
      }
    }
  }
}

}  // namespace

TEST_CASE("attention on tensor cores (--use-flash-attn) matches the CPU device (16-bit, small)") {
  auto gpu = open_gpu_or_skip(/*cpu_stand_in_allowed=*/false,
                              {.attention_backend = backend::AttentionBackend::flash});
  if (!gpu) return;
  check_16_bit_attention(*gpu, {{1, 1, 2, 2, 64}, {1, 65, 2, 1, 64}, {1, 70, 1, 1, 128}});
}

TEST_CASE("attention on tensor cores (--use-flash-attn) matches the CPU device (16-bit, larger)") {
  auto gpu = open_gpu_or_skip(/*cpu_stand_in_allowed=*/false,
                              {.attention_backend = backend::AttentionBackend::flash});
  if (!gpu) return;
  check_16_bit_attention(
      *gpu, {{2, 63, 4, 2, 64}, {1, 65, 2, 2, 128}, {2, 130, 4, 1, 64}, {1, 200, 4, 2, 128}});
}

// cuDNN's fused attention (attention_cudnn_cuda.cu): sequences that are multiples of 128 (every
// cuDNN 9 runs their backward), multi-head (GPT), multi-query and grouped-query (Llama: 4
// query heads per group, blocked queries) layouts, head dimensions 64 and 128. Under fused a
// refusal is an error, so a shape that passes here ran on cuDNN.
TEST_CASE("attention through cuDNN (--attention-backend fused) matches the CPU device (16-bit)") {
  auto gpu = open_gpu_or_skip(/*cpu_stand_in_allowed=*/false,
                              {.attention_backend = backend::AttentionBackend::fused});
  if (!gpu) return;
  check_16_bit_attention(*gpu,
                         {{1, 128, 2, 2, 64},
                          {2, 256, 4, 1, 64},
                          {1, 256, 8, 2, 128},
                          {2, 128, 4, 4, 128},
                          {1, 1024, 8, 2, 64}},
                         {0.0});
}

TEST_CASE("cuDNN's attention backward is its deterministic form: the same bits run to run") {
  auto gpu = open_gpu_or_skip(/*cpu_stand_in_allowed=*/false,
                              {.attention_backend = backend::AttentionBackend::fused});
  if (!gpu) return;
  const Shape s{4, 1024, 8, 2, 128};
  const int64_t hidden = s.heads * s.head_dim;
  const int64_t width = (s.heads + 2 * s.groups) * s.head_dim;
  const ElementType type = ElementType::bf16;
  Tensors t(*gpu);
  View x = t.input(representable(random_values(s.batch * s.seq * width, 41), type), type);
  View dout = t.input(representable(random_values(s.batch * s.seq * hidden, 42), type), type);
  View o = t.poisoned(s.batch * s.seq * hidden, type);
  View lse = t.poisoned(s.batch * s.heads * s.seq, ElementType::f32);
  View dx = t.poisoned(s.batch * s.seq * width, type);
  std::vector<std::vector<float>> runs;
  for (int run = 0; run < 3; ++run) {
    ops::attention_forward(*gpu, o, lse, x, s.geometry(), {});
    ops::attention_backward(*gpu, dx, dout, x, o, lse, s.geometry(), {});
    runs.push_back(t.read(dx));
  }
  CHECK(runs[0] == runs[1]);
  CHECK(runs[0] == runs[2]);
}

TEST_CASE(
    "--attention-backend fused refuses what cuDNN does not run, naming why, and auto runs it "
    "on our kernels") {
  const Shape s{1, 128, 2, 2, 64};
  const backend::Dropout dropout{0.1, backend::dropout_key(1, 2, 3, 4)};
  for (const auto backend_choice :
       {backend::AttentionBackend::fused, backend::AttentionBackend::automatic}) {
    auto gpu =
        open_gpu_or_skip(/*cpu_stand_in_allowed=*/false, {.attention_backend = backend_choice});
    if (!gpu) return;
    Tensors t(*gpu);
    const int64_t width = (s.heads + 2 * s.groups) * s.head_dim;
    View x = t.input(random_values(s.batch * s.seq * width, 51), ElementType::bf16);
    View o = t.poisoned(s.batch * s.seq * s.heads * s.head_dim, ElementType::bf16);
    View lse = t.poisoned(s.batch * s.heads * s.seq, ElementType::f32);
    if (backend_choice == backend::AttentionBackend::fused) {
      CHECK_THROWS_WITH_AS(ops::attention_forward(*gpu, o, lse, x, s.geometry(), dropout),
                           doctest::Contains("attention dropout through cuDNN"), common::Error);
      View x32 = t.input(random_values(s.batch * s.seq * width, 51), ElementType::f32);
      View o32 = t.poisoned(s.batch * s.seq * s.heads * s.head_dim, ElementType::f32);
      CHECK_THROWS_WITH_AS(ops::attention_forward(*gpu, o32, lse, x32, s.geometry(), {}),
                           doctest::Contains("not fp32"), common::Error);
    } else {
      CHECK_NOTHROW(ops::attention_forward(*gpu, o, lse, x, s.geometry(), dropout));
    }
  }
}

TEST_CASE("key/value-cache attention on the CUDA device matches the CPU device") {
  auto gpu = open_gpu_or_skip(/*cpu_stand_in_allowed=*/true);
  if (!gpu) return;
  struct CacheShape {
    int64_t heads, groups, head_dim;
  };
  const int64_t slots = 3, max_length = 80;
  // A prefill of slot 1 (positions 0..3, seeing each other), decodes of slots 0 and 2 deep in
  // caches filled before (the random initial caches stand for earlier steps).
  const std::vector<int32_t> row_slots{0, 1, 1, 1, 1, 2};
  const std::vector<int32_t> row_positions{70, 0, 1, 2, 3, 79};
  const auto rows = static_cast<int64_t>(row_slots.size());
  for (const CacheShape s : {CacheShape{2, 2, 8}, CacheShape{4, 2, 24}, CacheShape{4, 1, 64},
                             CacheShape{2, 2, 128}, CacheShape{3, 3, 40}}) {
    for (ElementType type : {ElementType::f32, ElementType::bf16, ElementType::f16}) {
      std::ostringstream what;
      what << "kv_cache_attention N " << rows << " NH " << s.heads << " NG " << s.groups
           << " HD " << s.head_dim;
      const int64_t width = (s.heads + 2 * s.groups) * s.head_dim;
      const int64_t cache = slots * max_length * s.groups * s.head_dim;
      const auto qkv = representable(random_values(rows * width, 51), type);
      const auto keys = representable(random_values(cache, 52), type);
      const auto values = representable(random_values(cache, 53), type);
      check_against_cpu(*gpu, what.str(), type, tolerance(type, 5e-5, 3e-2),
                        [&](Tensors& t, ElementType dtype) {
                          View key_cache = t.input(keys, dtype);
                          View value_cache = t.input(values, dtype);
                          View out = t.poisoned(rows * s.heads * s.head_dim, dtype);
                          ops::kv_cache_attention_forward(t.device(), out, key_cache, value_cache,
                                                          t.input(qkv, dtype), t.ids(row_slots),
                                                          t.ids(row_positions), rows, s.heads,
                                                          s.groups, s.head_dim, max_length);
                          return Outputs{{"output", t.read(out)},
                                         {"key cache", t.read(key_cache)},
                                         {"value cache", t.read(value_cache)}};
                        });
    }
  }
}
