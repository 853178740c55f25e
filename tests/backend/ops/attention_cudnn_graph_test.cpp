// cuDNN's fused attention graphs (ops/attention_cudnn_cuda.cu), checked without a GPU: cuDNN
// 9.8 and later finalize an operation graph without a handle, so the real library accepts or
// refuses every tensor, operation and the graph as described, for each layout the model uses
// (multi-head, multi-query, grouped-query with blocked queries), bf16 and fp16, head dimensions
// 64 and 128, without and with attention dropout (cuDNN's Bernoulli draws from a device seed).
// Which engine runs the graph needs the GPU (tests/gpu/attention_test.cpp).
#include <doctest/doctest.h>

#include <string>

#include "backend/common/error.hpp"
#include "backend/ops/attention.hpp"

namespace {

backend::AttentionShape shape(int64_t batch, int64_t seq, int64_t heads, int64_t groups,
                              int64_t head_dim) {
  return {.batch_size = batch,
          .seq_length = seq,
          .hidden_size = heads * head_dim,
          .num_heads = heads,
          .num_query_groups = groups};
}

}  // namespace

TEST_CASE("cuDNN accepts the fused attention's forward and backward graphs for every layout") {
  try {
    backend::cuda::cudnn_attention_graph_check(shape(1, 128, 2, 2, 64), backend::ElementType::bf16);
  } catch (const common::Error& error) {
    const std::string message = error.what();
    if (message.find("this build has no cuDNN") != std::string::npos ||
        message.find("cannot load cuDNN") != std::string::npos ||
        message.find("needs a handle") != std::string::npos) {
      MESSAGE("skipped: " << message);
      return;
    }
    FAIL(message);
  }
  struct Case {
    backend::AttentionShape shape;
    int64_t backward_operations;  // 21, and two reductions of dK, dV over each group's heads
  };
  for (const Case& c : {Case{shape(2, 1024, 12, 12, 64), 21}, Case{shape(4, 2048, 32, 8, 64), 23},
                        Case{shape(1, 256, 8, 1, 128), 23}, Case{shape(2, 128, 4, 2, 128), 23}}) {
    for (const auto type : {backend::ElementType::bf16, backend::ElementType::f16}) {
      for (const double dropout : {0.0, 0.1}) {
        CAPTURE(c.shape.num_heads);
        CAPTURE(c.shape.num_query_groups);
        CAPTURE(backend::element_name(type));
        CAPTURE(dropout);
        const backend::cuda::CudnnAttentionGraphs graphs =
            backend::cuda::cudnn_attention_graph_check(c.shape, type, dropout);
        CHECK(graphs.cudnn_version / 10000 == 9);
        // Q·Kᵀ, scale, the mask's four, max, sub, exp, sum, log, Stats, P, P·V; with dropout
        // the draws R, P∘R and the rescale.
        CHECK(graphs.forward_operations == (dropout > 0 ? 17 : 14));
        // With dropout: R, P∘R and its rescale for dV, dP∘R and dS's rescale.
        CHECK(graphs.backward_operations == c.backward_operations + (dropout > 0 ? 5 : 0));
        // Forward: Q, Kᵀ, V, two scalars, Stats, O; backward: Q, Kᵀ, Vᵀ, O, dO, Stats, three
        // scalars, softmax_sum, dQ, dK, dV; with dropout each also the seed, the offset and
        // the scale.
        CHECK(graphs.external_tensors == 7 + 13 + (dropout > 0 ? 6 : 0));
      }
    }
  }
  CHECK_THROWS_WITH_AS(backend::cuda::cudnn_attention_graph_check(shape(1, 128, 2, 2, 64),
                                                                  backend::ElementType::bf16, 1.0),
                       doctest::Contains("attention dropout 1 is not in [0, 1)"), common::Error);
  CHECK_THROWS_WITH_AS(backend::cuda::cudnn_attention_graph_check(shape(1, 128, 2, 2, 64),
                                                                  backend::ElementType::f32),
                       doctest::Contains("bf16 or fp16, not fp32"), common::Error);
  CHECK_THROWS_WITH_AS(backend::cuda::cudnn_attention_graph_check(shape(1, 128, 3, 2, 64),
                                                                  backend::ElementType::bf16),
                       doctest::Contains("query groups must divide"), common::Error);
}
