// GemmPlans: one CUDA device's cuBLASLt matrix products, planned once per shape. The device
// owns its cuBLASLt handle and workspace (device/cuda_device.cu) and these plans over them: per
// (shape, transposes, types, alignments, epilogue) the matmul descriptor, the three layouts and
// the algorithm the heuristic chose, made the first time a shape is used (the first micro
// batch of a shape; later calls only look it up). The products' callers are the op twins
// (ops/linear_cuda.cu). Only .cu files include this header (it names cuBLASLt's types).
//
// Determinism: one algorithm per plan, chosen once by the heuristic and cached, with the same
// workspace every call, so a shape gives the same bits run after run (cuBLAS's reproducibility
// rule: same toolkit, architecture and SM count). In-place split-K reduction is left out as a
// precaution: with beta = 1 the output buffer doubles as an accumulator (a weight gradient).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <tuple>

#include "backend/device/cuda_context.hpp"

namespace backend::cuda {

// One product's shape and kind: D (m, n) = op(A) (m, k) · op(B) (k, n), column-major.
struct GemmKey {
  int64_t m, n, k;
  bool transpose_a, transpose_b;
  cudaDataType_t a_type, c_type;  // B has A's type
  bool bias;
  uint32_t align_a, align_b, align_c;
  auto tie() const {
    return std::tie(m, n, k, transpose_a, transpose_b, a_type, c_type, bias, align_a, align_b,
                    align_c);
  }
  bool operator<(const GemmKey& other) const { return tie() < other.tie(); }
};

// A plan: what cuBLASLt needs to run one GemmKey.
struct GemmPlan {
  cublasLtMatmulDesc_t operation = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algorithm{};

  void release() noexcept;
};

class GemmPlans {
 public:
  GemmPlans(cublasLtHandle_t handle, void* workspace, int64_t workspace_bytes)
      : handle_(handle), workspace_(workspace), workspace_bytes_(workspace_bytes) {}
  ~GemmPlans();
  GemmPlans(const GemmPlans&) = delete;
  GemmPlans& operator=(const GemmPlans&) = delete;

  // D (m, n, ld m) = alpha · op(A) · op(B) + beta · C, C = D; A is (m, k) after op, stored
  // (k, m) when transposed; likewise B (k, n), stored (n, k) when transposed. bias: length m.
  void matmul(const GemmKey& key, const void* a, const void* b, void* d, const void* bias,
              float beta, cudaStream_t stream);

 private:
  GemmPlan& find(const GemmKey& key);
  void build(const GemmKey& key, GemmPlan& plan);

  cublasLtHandle_t handle_;
  void* workspace_;
  int64_t workspace_bytes_;
  std::map<GemmKey, GemmPlan> plans_;
};

}  // namespace backend::cuda
