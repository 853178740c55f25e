// A build without CUDA, or without cuDNN's headers, has no cuDNN attention
// (attention_cudnn_cuda.cu): the twins refuse every call, so --attention-backend auto runs our
// kernels, and the graph check says why.
#include "backend/ops/attention.hpp"

namespace backend::cuda {

namespace {
constexpr const char* kNoCudnn = "this build has no cuDNN (configure with cuDNN 9's headers)";
CudnnAttentionOutcome refused() {
  CudnnAttentionOutcome outcome;
  outcome.refusal = kNoCudnn;
  return outcome;
}
}  // namespace

template <typename Scalar>
CudnnAttentionOutcome cudnn_attention_forward(const CudaContext&, Scalar*, float*, const Scalar*,
                                              const AttentionShape&, const Dropout&) {
  return refused();
}

template <typename Scalar>
CudnnAttentionOutcome cudnn_attention_backward(const CudaContext&, Scalar*, const Scalar*,
                                               const Scalar*, const Scalar*, const float*,
                                               const AttentionShape&, const Dropout&) {
  return refused();
}

CudnnAttentionGraphs cudnn_attention_graph_check(const AttentionShape&, ElementType, double) {
  common::fail("cudnn_attention_graph_check: {}", kNoCudnn);
}

template CudnnAttentionOutcome cudnn_attention_forward<bfloat16>(const CudaContext&, bfloat16*,
                                                                 float*, const bfloat16*,
                                                                 const AttentionShape&,
                                                                 const Dropout&);
template CudnnAttentionOutcome cudnn_attention_forward<float16>(const CudaContext&, float16*,
                                                                float*, const float16*,
                                                                const AttentionShape&,
                                                                const Dropout&);
template CudnnAttentionOutcome cudnn_attention_backward<bfloat16>(const CudaContext&, bfloat16*,
                                                                  const bfloat16*, const bfloat16*,
                                                                  const bfloat16*, const float*,
                                                                  const AttentionShape&,
                                                                  const Dropout&);
template CudnnAttentionOutcome cudnn_attention_backward<float16>(const CudaContext&, float16*,
                                                                 const float16*, const float16*,
                                                                 const float16*, const float*,
                                                                 const AttentionShape&,
                                                                 const Dropout&);

}  // namespace backend::cuda
