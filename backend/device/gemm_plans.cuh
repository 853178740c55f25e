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
//
// --gemm-autotune (ours; docs/gemm_epilogues.md): the heuristic's first kAutotuneCandidates
// algorithms are kept, and at a plan's first call outside a stream capture each one is run on
// that call's operands into scratch; those whose output has the first algorithm's bits are
// timed (CUDA events, the best of kAutotuneRuns) and the fastest becomes the plan's algorithm.
// So the choice may change the speed, not the bits: a run with autotuning gives the bits of one
// without (two algorithms that agree on every element of a real product sum in the same order).
// A product whose output is above kAutotuneMaxBytes keeps the heuristic's choice (the scratch
// would cost more memory than the tuning is worth).
//
// Epilogues (docs/gemm_epilogues.md): the bias, and the MLP's GELU (tanh approximation, as
// ops/gelu.hpp) with its pre-activation kept in an auxiliary matrix (forward) or read from it
// (the backward's dGELU). The aux and bias pointers' alignments are part of the key, because
// the heuristic reads alignment from the pointers it is given; a plan is built with the first
// call's pointers. An epilogue the heuristic finds no algorithm for is remembered as refused:
// try_matmul returns false (every time, without asking again) and the caller runs the separate
// kernels.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <map>
#include <set>
#include <tuple>
#include <type_traits>

#include "backend/core/element_type.hpp"
#include "backend/device/cuda_context.hpp"

namespace backend::cuda {

// The alignment in bytes (up to 16) of a pointer, for the key: cuBLASLt assumes 256 unless
// told, and views into an arena may start anywhere the element size allows.
inline uint32_t gemm_alignment(const void* pointer) {
  const auto address = reinterpret_cast<uintptr_t>(pointer);
  uint32_t alignment = 16;
  while (alignment > 1 && address % alignment != 0) alignment /= 2;
  return alignment;
}

// cuBLASLt's name of an operand type.
template <typename S>
constexpr cudaDataType_t gemm_data_type() {
  if constexpr (std::is_same_v<S, float>) {
    return CUDA_R_32F;
  } else if constexpr (std::is_same_v<S, bfloat16>) {
    return CUDA_R_16BF;
  } else {
    static_assert(std::is_same_v<S, float16>, "products run in fp32, bf16 or fp16");
    return CUDA_R_16F;
  }
}

// What the product's epilogue adds: nothing; the bias (length m, along D's rows); GELU of the
// sum, optionally after the bias, with the pre-activation written to the aux matrix (m, n, ld
// aux_ld, D's type); or, in a backward, D ∘ GELU′(aux) with aux the forward's pre-activation.
enum class GemmEpilogue { none, bias, gelu_aux, gelu_aux_bias, dgelu };

// Whether the epilogue reads the bias pointer, and whether it reads or writes the aux matrix.
inline bool epilogue_has_bias(GemmEpilogue epilogue) {
  return epilogue == GemmEpilogue::bias || epilogue == GemmEpilogue::gelu_aux_bias;
}
inline bool epilogue_has_aux(GemmEpilogue epilogue) {
  return epilogue == GemmEpilogue::gelu_aux || epilogue == GemmEpilogue::gelu_aux_bias ||
         epilogue == GemmEpilogue::dgelu;
}
const char* epilogue_name(GemmEpilogue epilogue);

// One product's shape and kind: D (m, n) = op(A) (m, k) · op(B) (k, n), column-major.
struct GemmKey {
  int64_t m, n, k;
  bool transpose_a, transpose_b;
  cudaDataType_t a_type, c_type;  // B has A's type
  GemmEpilogue epilogue = GemmEpilogue::none;
  uint32_t align_a, align_b, align_c;
  uint32_t align_bias = 0, align_aux = 0;  // of the epilogue's pointers, 0 where unused
  int64_t aux_ld = 0;                      // the aux matrix's leading dimension, ≥ m
  auto tie() const {
    return std::tie(m, n, k, transpose_a, transpose_b, a_type, c_type, epilogue, align_a, align_b,
                    align_c, align_bias, align_aux, aux_ld);
  }
  bool operator<(const GemmKey& other) const { return tie() < other.tie(); }
};

// The epilogue's operands: the bias vector and the aux matrix, each nullptr where the
// epilogue does not use it.
struct GemmEpilogueOperands {
  const void* bias = nullptr;
  const void* aux = nullptr;  // written by the forward's GELU epilogues (cuBLASLt takes it so)
};

// A plan: what cuBLASLt needs to run one GemmKey.
struct GemmPlan {
  cublasLtMatmulDesc_t operation = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algorithm{};
  // --gemm-autotune: the heuristic's candidates (the first is `algorithm`), until the first
  // call outside a capture has timed them; none after, or without autotuning. (An array: nvcc
  // 13.0's front end fails an assertion on a std::vector of cuBLASLt's algorithm here.)
  std::array<cublasLtMatmulAlgo_t, 8> candidates{};  // kAutotuneCandidates
  int candidate_count = 0;

  void release() noexcept;
};

inline constexpr int kAutotuneCandidates = 8;
inline constexpr int kAutotuneRuns = 5;
inline constexpr int64_t kAutotuneMaxBytes = int64_t{256} << 20;

class GemmPlans {
 public:
  GemmPlans(cublasLtHandle_t handle, void* workspace, int64_t workspace_bytes,
            bool autotune = false)
      : handle_(handle),
        workspace_(workspace),
        workspace_bytes_(workspace_bytes),
        autotune_(autotune) {}
  ~GemmPlans();
  GemmPlans(const GemmPlans&) = delete;
  GemmPlans& operator=(const GemmPlans&) = delete;

  // D (m, n, ld m) = epilogue(alpha · op(A) · op(B) + beta · C), C = D; A is (m, k) after op,
  // stored (k, m) when transposed; likewise B (k, n), stored (n, k) when transposed.
  // common::Error when cuBLASLt has no algorithm for the key.
  void matmul(const GemmKey& key, const void* a, const void* b, void* d,
              GemmEpilogueOperands operands, float beta, cudaStream_t stream);
  // The same for a key cuBLASLt may refuse (a fused epilogue): false, with nothing run, when it
  // has no algorithm for it (asked once per key, logged once).
  bool try_matmul(const GemmKey& key, const void* a, const void* b, void* d,
                  GemmEpilogueOperands operands, float beta, cudaStream_t stream);

 private:
  // The key's plan, built on first use with these operands; nullptr when refused.
  GemmPlan* find(const GemmKey& key, GemmEpilogueOperands operands);
  // false when the heuristic finds no algorithm.
  bool build(const GemmKey& key, GemmEpilogueOperands operands, GemmPlan& plan);
  void run(const GemmKey& key, GemmPlan& plan, const void* a, const void* b, void* d,
           GemmEpilogueOperands operands, float beta, cudaStream_t stream);
  // --gemm-autotune: plan.algorithm becomes the fastest candidate with the first's bits on
  // these operands (d is left as it was).
  void tune(const GemmKey& key, GemmPlan& plan, const void* a, const void* b, const void* d,
            float beta, cudaStream_t stream);
  // One product with `algorithm` into d (C = d); false when cuBLASLt refuses to run it.
  bool run_algorithm(const GemmPlan& plan, const cublasLtMatmulAlgo_t& algorithm, const void* a,
                     const void* b, void* d, float beta, cudaStream_t stream);

  cublasLtHandle_t handle_;
  void* workspace_;
  int64_t workspace_bytes_;
  bool autotune_;
  std::map<GemmKey, GemmPlan> plans_;
  std::set<GemmKey> refused_;
};

}  // namespace backend::cuda
