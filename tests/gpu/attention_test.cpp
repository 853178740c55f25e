// Causal GQA attention on the CUDA device against the CPU device: forward (output and the
// fp32 log-sum-exp) and backward (dqkv, overwritten), fp32, bf16 and fp16, head dimensions 8,
// 24, 64 and 128, multi-head, grouped and multi-query layouts, sequence lengths that are not
// multiples of the tile (1, 7, 129), with and without attention dropout (the same mask
// elements as the CPU twin), run to run identical. The key/value-cache attention of decoding
// too: the stored caches and the output, rows of several slots at several positions. And the
// tensor-core kernel of --attention-backend flash, bf16 and fp16 at head dimensions 64 and 128,
// and cuDNN's fused attention (--attention-backend fused): multi-head, multi-query and grouped
// layouts, head dimensions 64 and 128, its backward the same bits run to run, its attention
// dropout (its own mask, read back), its refusals.
#include "backend/ops/attention.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "backend/ops/dropout.hpp"
#include "gpu/attention_reference.hpp"
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

namespace {

// Where head h's query (slot h % per_group of its group), or its group's key (slot per_group)
// or value (slot per_group + 1), starts in a qkv row (Megatron core's grouped layout).
int64_t qkv_column(const Shape& s, int64_t group, int64_t slot) {
  return (group * (s.heads / s.groups + 2) + slot) * s.head_dim;
}

// The fp64 reference (gpu/attention_reference.hpp) with the explicit keep mask
// mask[((b·NH + h)·T + i)·T + j] of dropout probability p, as floats for expect_close.
struct MaskedReference {
  std::vector<float> output, dqkv;
};
MaskedReference masked_attention(const Shape& s, const std::vector<float>& qkv,
                                 const std::vector<float>& dout, const std::vector<char>& mask,
                                 double probability) {
  const double keep = 1.0 / (1.0 - probability);
  const AttentionReference r = attention_reference(
      {s.batch, s.seq, s.heads, s.groups, s.head_dim}, qkv, dout,
      [&](int64_t pair, int64_t i, int64_t j) {
        return mask[static_cast<size_t>((pair * s.seq + i) * s.seq + j)] ? keep : 0.0;
      });
  const auto floats = [](const std::vector<double>& values) {
    return std::vector<float>(values.begin(), values.end());
  };
  return {floats(r.output), floats(r.dqkv)};
}

}  // namespace

// The reference above is itself checked on the CPU device: given the CPU twin's own mask
// (dropout.hpp's draws, element ((b·NH + h)·T + i)·T + j), it gives the twin's results.
TEST_CASE("the masked-attention reference of the cuDNN dropout check is the CPU twin's math") {
  backend::CpuDevice cpu;
  const double probability = 0.1;
  const backend::Dropout dropout{probability, backend::dropout_key(5, 6, 7, 8)};
  for (const Shape s : {Shape{2, 19, 2, 2, 16}, Shape{1, 23, 4, 2, 8}}) {
    const int64_t width = (s.heads + 2 * s.groups) * s.head_dim, hidden = s.heads * s.head_dim;
    const std::vector<float> qkv = random_values(s.batch * s.seq * width, 71);
    const std::vector<float> dout = random_values(s.batch * s.seq * hidden, 72);
    std::vector<char> mask(static_cast<size_t>(s.batch * s.heads * s.seq * s.seq));
    for (size_t i = 0; i < mask.size(); ++i) {
      mask[i] = backend::dropout_keep(dropout.key, i, dropout.threshold());
    }
    const MaskedReference expected = masked_attention(s, qkv, dout, mask, probability);
    Tensors t(cpu);
    View x = t.input(qkv, ElementType::f32);
    View o = t.poisoned(s.batch * s.seq * hidden, ElementType::f32);
    View lse = t.poisoned(s.batch * s.heads * s.seq, ElementType::f32);
    ops::attention_forward(cpu, o, lse, x, s.geometry(), dropout);
    View dx = t.poisoned(s.batch * s.seq * width, ElementType::f32);
    ops::attention_backward(cpu, dx, t.input(dout, ElementType::f32), x, o, lse, s.geometry(),
                            dropout);
    expect_close("reference output", t.read(o), expected.output, 1e-5);
    expect_close("reference dqkv", t.read(dx), expected.dqkv, 1e-5);
  }
}

// cuDNN's attention dropout draws its own mask (not the CPU twin's), so its check reads the mask
// back: with V one-hot (value j = unit vector j, T ≤ HD) the output row i is P[i, :] ∘ R / (1 − p),
// zero exactly where R drops. Then, with the same key and random values, the output and every
// gradient against a double-precision reference that uses that mask: a backward that regenerated
// another mask, or scaled by other factors, fails it. The kept fraction is 1 − p; the key staged
// in device memory (a captured step's) draws the same mask; another key draws another.
TEST_CASE("cuDNN's attention dropout: one mask for forward and backward, the gradients of it") {
  auto gpu = open_gpu_or_skip(/*cpu_stand_in_allowed=*/false,
                              {.attention_backend = backend::AttentionBackend::fused});
  if (!gpu || !cudnn_takes_attention_dropout_or_skip()) return;
  const double probability = 0.1;
  const backend::Dropout dropout{probability, backend::dropout_key(5, 6, 7, 8)};
  for (const Shape s : {Shape{2, 128, 2, 2, 128}, Shape{1, 128, 4, 2, 128}}) {
    CAPTURE(s.heads);
    CAPTURE(s.groups);
    const int64_t T = s.seq, D = s.head_dim, per_group = s.heads / s.groups;
    const int64_t width = (s.heads + 2 * s.groups) * D, hidden = s.heads * D;
    const ElementType type = ElementType::bf16;
    std::vector<float> qkv = representable(random_values(s.batch * T * width, 61, 0.5f), type);
    std::vector<float> one_hot = qkv;
    for (int64_t b = 0; b < s.batch; ++b) {
      for (int64_t t = 0; t < T; ++t) {
        for (int64_t g = 0; g < s.groups; ++g) {
          for (int64_t d = 0; d < D; ++d) {
            one_hot[static_cast<size_t>((b * T + t) * width + qkv_column(s, g, per_group + 1) +
                                        d)] = d == t ? 1.0f : 0.0f;
          }
        }
      }
    }
    const std::vector<float> dout = representable(random_values(s.batch * T * hidden, 62), type);
    Tensors t(*gpu);
    View lse = t.poisoned(s.batch * s.heads * T, ElementType::f32);
    const auto forward = [&](const std::vector<float>& values, const backend::Dropout& mask) {
      View o = t.poisoned(s.batch * T * hidden, type);
      ops::attention_forward(*gpu, o, lse, t.input(values, type), s.geometry(), mask);
      return t.read(o);
    };
    // R from the one-hot run: row i of head h, column j ≤ i.
    const std::vector<float> probe = forward(one_hot, dropout);
    std::vector<char> mask(static_cast<size_t>(s.batch * s.heads * T * T), 0);
    int64_t kept = 0, causal = 0;
    for (int64_t b = 0; b < s.batch; ++b) {
      for (int64_t h = 0; h < s.heads; ++h) {
        for (int64_t i = 0; i < T; ++i) {
          for (int64_t j = 0; j <= i; ++j) {
            const float value = probe[static_cast<size_t>((b * T + i) * hidden + h * D + j)];
            const bool keep = value != 0.0f;
            mask[static_cast<size_t>(((b * s.heads + h) * T + i) * T + j)] = keep;
            kept += keep;
            ++causal;
          }
        }
      }
    }
    const double fraction = static_cast<double>(kept) / static_cast<double>(causal);
    INFO("kept " << kept << " of " << causal);
    CHECK(std::fabs(fraction - (1.0 - probability)) < 0.02);
    // Another key draws another mask; the key staged in device memory the same one.
    CHECK(forward(one_hot, {probability, backend::dropout_key(5, 6, 7, 9)}) != probe);
    expect_identical("the one-hot output with the stored key",
                     forward(one_hot, t.with_stored_key(dropout)), probe);

    const MaskedReference expected = masked_attention(s, qkv, dout, mask, probability);
    for (const bool stored : {false, true}) {
      const backend::Dropout call = stored ? t.with_stored_key(dropout) : dropout;
      View x = t.input(qkv, type);
      View o = t.poisoned(s.batch * T * hidden, type);
      ops::attention_forward(*gpu, o, lse, x, s.geometry(), call);
      View dx = t.poisoned(s.batch * T * width, type);
      ops::attention_backward(*gpu, dx, t.input(dout, type), x, o, lse, s.geometry(), call);
      const std::string what = stored ? " (stored key)" : "";
      expect_close("cuDNN dropout output" + what, t.read(o), expected.output, 3e-2);
      expect_close("cuDNN dropout dqkv" + what, t.read(dx), expected.dqkv, 3e-2);
    }
  }
}

TEST_CASE(
    "--attention-backend fused refuses what cuDNN does not run, naming why, and auto runs it "
    "on our kernels") {
  const Shape s{1, 1, 2, 2, 64};  // cuDNN takes no sequence of one position
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
      CHECK_THROWS_WITH_AS(ops::attention_forward(*gpu, o, lse, x, s.geometry(), {}),
                           doctest::Contains("a sequence of one position"), common::Error);
      View x32 = t.input(random_values(s.batch * s.seq * width, 51), ElementType::f32);
      View o32 = t.poisoned(s.batch * s.seq * s.heads * s.head_dim, ElementType::f32);
      CHECK_THROWS_WITH_AS(ops::attention_forward(*gpu, o32, lse, x32, s.geometry(), {}),
                           doctest::Contains("not fp32"), common::Error);
    } else {
      CHECK_NOTHROW(ops::attention_forward(*gpu, o, lse, x, s.geometry(), {}));
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
