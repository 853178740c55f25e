// CUDA twin of linear.hpp through cuBLASLt (llm.c's matmul_cublaslt shows the approach; this
// is written for row-major views and cached plans).
//
// cuBLASLt is column-major; a row-major (R, C) matrix is the column-major (C, R) matrix, its
// transpose. So, with row-major x (N, IN), W (OUT, IN), y (N, OUT):
//   forward   y = x·W^T + b    ⇔  y^T (OUT, N)  = op_T(W^T as stored (IN, OUT)) · x^T (IN, N)
//                                  m = OUT, n = N, k = IN; the bias runs along m (BIAS epilogue)
//   dinput   dx = dy·W         ⇔  dx^T (IN, N)  = W^T (IN, OUT) · dy^T (OUT, N)
//                                  m = IN, n = N, k = OUT; beta = 0 (overwrites)
//   dweight dW += dy^T·x       ⇔  dW^T (IN, OUT) += x^T (IN, N) · op_T(dy^T as stored (OUT, N))
//                                  m = IN, n = OUT, k = N; beta = 1, C = D (accumulates)
// Types: fp32 operands with CUBLAS_COMPUTE_32F (not _FAST_TF32: fp32 results match the CPU to
// rounding), or bf16 or fp16 operands with fp32 compute; dW is fp32 in all (C/D fp32).
// dbias += Σ_rows dy: one thread per column sums its rows in a fixed order (8 interleaved
// partial sums joined in order); no atomics.
//
// Determinism: one algorithm per plan, chosen once by the heuristic and cached, with the same
// workspace every call, so a shape gives the same bits run after run (cuBLAS's reproducibility
// rule: same toolkit, architecture and SM count). In-place split-K reduction is left out as a
// precaution: with beta = 1 its output buffer doubles as the accumulator of dW.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <map>
#include <tuple>
#include <type_traits>

#include "backend/common/error.hpp"
#include "backend/device/cublaslt_library.cuh"
#include "backend/device/cuda_check.cuh"
#include "backend/ops/cuda_common.cuh"
#include "backend/ops/linear.hpp"

namespace backend::cuda {
namespace {

// The alignment in bytes (up to 16) of a pointer: cuBLASLt assumes 256 unless told, and views
// into an arena may start anywhere the element size allows.
uint32_t alignment_of(const void* pointer) {
  const auto address = reinterpret_cast<uintptr_t>(pointer);
  uint32_t alignment = 16;
  while (alignment > 1 && address % alignment != 0) alignment /= 2;
  return alignment;
}

struct PlanKey {
  int64_t m, n, k;
  bool transpose_a, transpose_b;
  cudaDataType_t a_type, c_type;  // B has A's type
  bool bias;
  uint32_t align_a, align_b, align_c;
  auto tie() const {
    return std::tie(m, n, k, transpose_a, transpose_b, a_type, c_type, bias, align_a, align_b,
                    align_c);
  }
  bool operator<(const PlanKey& other) const { return tie() < other.tie(); }
};

struct Plan {
  cublasLtMatmulDesc_t operation = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algorithm{};

  void release() noexcept {
    if (a != nullptr) (void)cuda_detail::cublaslt().matrix_layout_destroy(a);
    if (b != nullptr) (void)cuda_detail::cublaslt().matrix_layout_destroy(b);
    if (c != nullptr) (void)cuda_detail::cublaslt().matrix_layout_destroy(c);
    if (operation != nullptr) (void)cuda_detail::cublaslt().matmul_desc_destroy(operation);
  }
};

template <typename S>
constexpr cudaDataType_t data_type() {
  if constexpr (std::is_same_v<S, float>) {
    return CUDA_R_32F;
  } else if constexpr (std::is_same_v<S, bfloat16>) {
    return CUDA_R_16BF;
  } else {
    static_assert(std::is_same_v<S, float16>, "linear runs in fp32, bf16 or fp16");
    return CUDA_R_16F;
  }
}

constexpr int kBiasColumns = 32;  // threads along the columns (coalesced rows)
constexpr int kBiasSlices = 8;    // interleaved row partials per column, joined in order

// dbias[c] += Σ_r doutput[r, c]: slice s sums rows s, s + 8, …; then slice 0 adds the 8
// partials in order. The grid covers the columns only, so the order is fixed by the shape.
template <typename T>
__global__ void bias_gradient_kernel(float* dbias, const T* doutput, int64_t rows,
                                     int64_t columns) {
  __shared__ float partial[kBiasSlices][kBiasColumns];
  const int64_t column = int64_t{blockIdx.x} * kBiasColumns + threadIdx.x;
  float accumulated = 0;
  if (column < columns) {
    for (int64_t row = threadIdx.y; row < rows; row += kBiasSlices) {
      accumulated += detail::to_float(doutput[row * columns + column]);
    }
  }
  partial[threadIdx.y][threadIdx.x] = accumulated;
  __syncthreads();
  if (threadIdx.y == 0 && column < columns) {
    float total = 0;
    for (int slice = 0; slice < kBiasSlices; ++slice) total += partial[slice][threadIdx.x];
    dbias[column] += total;
  }
}

}  // namespace

class GemmPlans {
 public:
  GemmPlans(cublasLtHandle_t handle, void* workspace, int64_t workspace_bytes)
      : handle_(handle), workspace_(workspace), workspace_bytes_(workspace_bytes) {}
  ~GemmPlans() {
    for (auto& [key, plan] : plans_) plan.release();
  }
  GemmPlans(const GemmPlans&) = delete;
  GemmPlans& operator=(const GemmPlans&) = delete;

  // D (m, n, ld m) = alpha · op(A) · op(B) + beta · C, C = D; A is (m, k) after op, stored
  // (k, m) when transposed; likewise B (k, n), stored (n, k) when transposed. bias: length m.
  void matmul(const PlanKey& key, const void* a, const void* b, void* d, const void* bias,
              float beta, cudaStream_t stream) {
    Plan& plan = find(key);
    if (key.bias) {
      CUBLAS_CHECK(cuda_detail::cublaslt().matmul_desc_set_attribute(plan.operation,
                                                  CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                                  sizeof(bias)));
    }
    const float alpha = 1.0f;
    CUBLAS_CHECK(cuda_detail::cublaslt().matmul(handle_, plan.operation, &alpha, a, plan.a, b, plan.b, &beta, d,
                                plan.c, d, plan.c, &plan.algorithm, workspace_,
                                static_cast<size_t>(workspace_bytes_), stream));
  }

 private:
  Plan& find(const PlanKey& key) {
    auto found = plans_.find(key);
    if (found != plans_.end()) return found->second;
    Plan plan;
    try {
      build(key, plan);
    } catch (...) {
      plan.release();
      throw;
    }
    return plans_.emplace(key, plan).first->second;
  }

  void build(const PlanKey& key, Plan& plan) {
    CUBLAS_CHECK(cuda_detail::cublaslt().matmul_desc_create(&plan.operation, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t op_a = key.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_b = key.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    CUBLAS_CHECK(cuda_detail::cublaslt().matmul_desc_set_attribute(plan.operation, CUBLASLT_MATMUL_DESC_TRANSA,
                                                &op_a, sizeof(op_a)));
    CUBLAS_CHECK(cuda_detail::cublaslt().matmul_desc_set_attribute(plan.operation, CUBLASLT_MATMUL_DESC_TRANSB,
                                                &op_b, sizeof(op_b)));
    if (key.bias) {
      const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
      CUBLAS_CHECK(cuda_detail::cublaslt().matmul_desc_set_attribute(plan.operation, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                  &epilogue, sizeof(epilogue)));
      // The bias has D's type (the default for fp32, bf16 and fp16 outputs), stated for
      // clarity.
      const cudaDataType_t bias_type = key.c_type;
      CUBLAS_CHECK(cuda_detail::cublaslt().matmul_desc_set_attribute(
          plan.operation, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)));
    }
    const auto rows_a = static_cast<uint64_t>(key.transpose_a ? key.k : key.m);
    const auto cols_a = static_cast<uint64_t>(key.transpose_a ? key.m : key.k);
    const auto rows_b = static_cast<uint64_t>(key.transpose_b ? key.n : key.k);
    const auto cols_b = static_cast<uint64_t>(key.transpose_b ? key.k : key.n);
    CUBLAS_CHECK(cuda_detail::cublaslt().matrix_layout_create(&plan.a, key.a_type, rows_a, cols_a,
                                            static_cast<int64_t>(rows_a)));
    CUBLAS_CHECK(cuda_detail::cublaslt().matrix_layout_create(&plan.b, key.a_type, rows_b, cols_b,
                                            static_cast<int64_t>(rows_b)));
    CUBLAS_CHECK(cuda_detail::cublaslt().matrix_layout_create(&plan.c, key.c_type, static_cast<uint64_t>(key.m),
                                            static_cast<uint64_t>(key.n), key.m));

    // The preference is only needed for the heuristic: released however this scope ends.
    struct Preference {
      cublasLtMatmulPreference_t handle = nullptr;
      ~Preference() {
        if (handle != nullptr) (void)cuda_detail::cublaslt().matmul_preference_destroy(handle);
      }
    } preference;
    CUBLAS_CHECK(cuda_detail::cublaslt().matmul_preference_create(&preference.handle));
    const auto workspace = static_cast<uint64_t>(workspace_bytes_);
    CUBLAS_CHECK(cuda_detail::cublaslt().matmul_preference_set_attribute(
        preference.handle, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
        sizeof(workspace)));
    // No in-place split-K reduction (see the top of the file).
    const uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_NONE |
                             CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE |
                             CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE;
    CUBLAS_CHECK(cuda_detail::cublaslt().matmul_preference_set_attribute(
        preference.handle, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes,
        sizeof(schemes)));
    // The operands' real alignments (cuBLASLt would otherwise assume 256 bytes).
    CUBLAS_CHECK(cuda_detail::cublaslt().matmul_preference_set_attribute(
        preference.handle, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &key.align_a,
        sizeof(key.align_a)));
    CUBLAS_CHECK(cuda_detail::cublaslt().matmul_preference_set_attribute(
        preference.handle, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &key.align_b,
        sizeof(key.align_b)));
    CUBLAS_CHECK(cuda_detail::cublaslt().matmul_preference_set_attribute(
        preference.handle, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &key.align_c,
        sizeof(key.align_c)));
    CUBLAS_CHECK(cuda_detail::cublaslt().matmul_preference_set_attribute(
        preference.handle, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &key.align_c,
        sizeof(key.align_c)));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    CUBLAS_CHECK(cuda_detail::cublaslt().matmul_algo_get_heuristic(handle_, plan.operation, plan.a, plan.b, plan.c,
                                                plan.c, preference.handle, 1, &result, &found));
    if (found == 0) {
      common::fail("cuBLASLt has no algorithm for a {}x{}x{} product ({}{}, A/B type {}, C type "
                   "{}, bias {}, alignments {}/{}/{} bytes)",
                   key.m, key.n, key.k, key.transpose_a ? "A^T" : "A",
                   key.transpose_b ? "·B^T" : "·B", static_cast<int>(key.a_type),
                   static_cast<int>(key.c_type), key.bias, key.align_a, key.align_b,
                   key.align_c);
    }
    plan.algorithm = result.algo;
  }

  cublasLtHandle_t handle_;
  void* workspace_;
  int64_t workspace_bytes_;
  std::map<PlanKey, Plan> plans_;
};

void GemmPlansDeleter::operator()(GemmPlans* plans) const noexcept { delete plans; }

GemmPlansPtr make_gemm_plans(cublasLtContext* handle, void* workspace, int64_t workspace_bytes) {
  return GemmPlansPtr(new GemmPlans(handle, workspace, workspace_bytes));
}

namespace {

void check_shape(const char* op, int64_t rows, int64_t in_features, int64_t out_features) {
  if (rows < 0 || in_features <= 0 || out_features <= 0) {
    common::fail("{}: {} rows, {} input and {} output features", op, rows, in_features,
                 out_features);
  }
}

}  // namespace

template <typename Scalar>
void linear_forward(Scalar* output, const Scalar* input, const Scalar* weight,
                    const Scalar* bias, int64_t rows, int64_t in_features, int64_t out_features,
                    GemmPlans& plans, CudaStream stream) {
  check_shape("linear_forward", rows, in_features, out_features);
  if (rows == 0) return;
  const PlanKey key{.m = out_features,
                    .n = rows,
                    .k = in_features,
                    .transpose_a = true,
                    .transpose_b = false,
                    .a_type = data_type<Scalar>(),
                    .c_type = data_type<Scalar>(),
                    .bias = bias != nullptr,
                    .align_a = alignment_of(weight),
                    .align_b = alignment_of(input),
                    .align_c = alignment_of(output)};
  plans.matmul(key, weight, input, output, bias, 0.0f, stream);
}

template <typename Scalar>
void linear_backward(Scalar* dinput, float* dweight, float* dbias, const Scalar* doutput,
                     const Scalar* input, const Scalar* weight, int64_t rows,
                     int64_t in_features, int64_t out_features, GemmPlans& plans,
                     CudaStream stream) {
  check_shape("linear_backward", rows, in_features, out_features);
  if (rows == 0) return;
  if (dinput != nullptr) {
    const PlanKey key{.m = in_features,
                      .n = rows,
                      .k = out_features,
                      .transpose_a = false,
                      .transpose_b = false,
                      .a_type = data_type<Scalar>(),
                      .c_type = data_type<Scalar>(),
                      .bias = false,
                      .align_a = alignment_of(weight),
                      .align_b = alignment_of(doutput),
                      .align_c = alignment_of(dinput)};
    plans.matmul(key, weight, doutput, dinput, nullptr, 0.0f, stream);
  }
  const PlanKey key{.m = in_features,
                    .n = out_features,
                    .k = rows,
                    .transpose_a = false,
                    .transpose_b = true,
                    .a_type = data_type<Scalar>(),
                    .c_type = CUDA_R_32F,
                    .bias = false,
                    .align_a = alignment_of(input),
                    .align_b = alignment_of(doutput),
                    .align_c = alignment_of(dweight)};
  plans.matmul(key, input, doutput, dweight, nullptr, 1.0f, stream);
  if (dbias != nullptr) {
    const dim3 block(kBiasColumns, kBiasSlices);
    const auto blocks = static_cast<unsigned>((out_features + kBiasColumns - 1) / kBiasColumns);
    bias_gradient_kernel<<<blocks, block, 0, stream>>>(
        dbias, detail::device_pointer(doutput), rows, out_features);
    CUDA_CHECK(cudaGetLastError());
  }
}

template void linear_forward<float>(float*, const float*, const float*, const float*, int64_t,
                                    int64_t, int64_t, GemmPlans&, CudaStream);
template void linear_forward<bfloat16>(bfloat16*, const bfloat16*, const bfloat16*,
                                       const bfloat16*, int64_t, int64_t, int64_t, GemmPlans&,
                                       CudaStream);
template void linear_backward<float>(float*, float*, float*, const float*, const float*,
                                     const float*, int64_t, int64_t, int64_t, GemmPlans&,
                                     CudaStream);
template void linear_backward<bfloat16>(bfloat16*, float*, float*, const bfloat16*,
                                        const bfloat16*, const bfloat16*, int64_t, int64_t,
                                        int64_t, GemmPlans&, CudaStream);
template void linear_forward<float16>(float16*, const float16*, const float16*, const float16*,
                                      int64_t, int64_t, int64_t, GemmPlans&, CudaStream);
template void linear_backward<float16>(float16*, float*, float*, const float16*, const float16*,
                                       const float16*, int64_t, int64_t, int64_t, GemmPlans&,
                                       CudaStream);

}  // namespace backend::cuda
