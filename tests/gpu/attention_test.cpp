// Causal GQA attention on the CUDA device against the CPU device: forward (output and the
// fp32 log-sum-exp) and backward (dqkv, overwritten), fp32 and bf16, head dimensions 8, 24, 64
// and 128, multi-head, grouped and multi-query layouts, sequence lengths that are not
// multiples of the tile (1, 7, 129), with and without attention dropout (the same mask
// elements as the CPU twin), run to run identical.
#include <doctest/doctest.h>

#include <cstdint>
#include <sstream>
#include <string>

#include "backend/ops/dropout.hpp"
#include "gpu/gpu_test_support.hpp"

using backend::ElementType;
using backend::View;
using namespace gpu_test;

TEST_CASE("attention on the CUDA device matches the CPU device (fp32, bf16, dropout)") {
  auto gpu = open_gpu_or_skip(/*cpu_stand_in_allowed=*/true);
  if (!gpu) return;
  struct Shape {
    int64_t batch, seq, heads, groups, head_dim;
  };
  for (const Shape s : {Shape{1, 1, 2, 2, 8}, Shape{2, 7, 4, 2, 24}, Shape{2, 129, 4, 1, 64},
                        Shape{1, 70, 2, 2, 128}, Shape{1, 33, 3, 3, 8}}) {
    for (double probability : {0.0, 0.1}) {
      for (ElementType type : {ElementType::f32, ElementType::bf16}) {
        std::ostringstream what;
        what << "attention B " << s.batch << " T " << s.seq << " NH " << s.heads << " NG "
             << s.groups << " HD " << s.head_dim << " dropout " << probability;
        const int64_t hidden = s.heads * s.head_dim;
        const int64_t width = (s.heads + 2 * s.groups) * s.head_dim;
        const backend::Dropout dropout{probability, backend::dropout_key(1, 2, 3, 4)};
        const auto qkv = representable(random_values(s.batch * s.seq * width, 21), type);
        const auto dout = representable(random_values(s.batch * s.seq * hidden, 22), type);
        // bf16 also rounds the forward's output, which the backward's Δ = Σ dO·O reads.
        check_against_cpu(
            *gpu, what.str(), type, tolerance(type, 5e-5, 3e-2),
            [&](Tensors& t, ElementType dtype) {
              Device& device = t.device();
              View x = t.input(qkv, dtype);
              View o = t.poisoned(s.batch * s.seq * hidden, dtype);
              // The log-sum-exp is fp32 on the GPU whatever the qkv type; the CPU keeps qkv's.
              View lse = t.poisoned(s.batch * s.heads * s.seq, ElementType::f32);
              device.attention_forward(o, lse, x, s.batch, s.seq, hidden, s.heads, s.groups,
                                       dropout);
              View dx = t.poisoned(s.batch * s.seq * width, dtype);
              device.attention_backward(dx, t.input(dout, dtype), x, o, lse, s.batch, s.seq,
                                        hidden, s.heads, s.groups, dropout);
              return Outputs{{"output", t.read(o)}, {"logsumexp", t.read(lse)},
                             {"dqkv", t.read(dx)}};
            });
      }
    }
  }
}
