// GemmPlans (gemm_plans.cuh): plans made on first use, looked up after; refusals remembered;
// with --gemm-autotune, the heuristic's candidates that give its first choice's bits timed at a
// plan's first call outside a capture.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "backend/common/error.hpp"
#include "backend/core/cuda_check.cuh"
#include "backend/device/cublaslt_library.cuh"
#include "backend/device/gemm_plans.cuh"

namespace backend::cuda {

void GemmPlan::release() noexcept {
  if (a != nullptr) (void)cuda_detail::cublaslt().matrix_layout_destroy(a);
  if (b != nullptr) (void)cuda_detail::cublaslt().matrix_layout_destroy(b);
  if (c != nullptr) (void)cuda_detail::cublaslt().matrix_layout_destroy(c);
  if (operation != nullptr) (void)cuda_detail::cublaslt().matmul_desc_destroy(operation);
}

GemmPlans::~GemmPlans() {
  for (auto& [key, plan] : plans_) plan.release();
}

const char* epilogue_name(GemmEpilogue epilogue) {
  switch (epilogue) {
    case GemmEpilogue::none:
      return "no";
    case GemmEpilogue::bias:
      return "BIAS";
    case GemmEpilogue::gelu_aux:
      return "GELU_AUX";
    case GemmEpilogue::gelu_aux_bias:
      return "GELU_AUX_BIAS";
    case GemmEpilogue::dgelu:
      return "DGELU";
  }
  return "unknown";
}

namespace {

std::string describe(const GemmKey& key) {
  return fmt::format(
      "a {}x{}x{} product ({}{}, A/B type {}, C type {}, {} epilogue, alignments {}/{}/{} "
      "bytes{})",
      key.m, key.n, key.k, key.transpose_a ? "A^T" : "A", key.transpose_b ? "·B^T" : "·B",
      static_cast<int>(key.a_type), static_cast<int>(key.c_type), epilogue_name(key.epilogue),
      key.align_a, key.align_b, key.align_c,
      epilogue_has_aux(key.epilogue) ? fmt::format(", aux ld {}", key.aux_ld) : "");
}

// The tuning's scratch and events, released however tune() ends.
struct TuningScratch {
  void* original = nullptr;
  void* reference = nullptr;
  void* trial = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  ~TuningScratch() {
    // cudaFree(nullptr) does nothing.
    (void)cudaFree(original);
    (void)cudaFree(reference);
    (void)cudaFree(trial);
    if (start != nullptr) (void)cudaEventDestroy(start);
    if (stop != nullptr) (void)cudaEventDestroy(stop);
  }
};

// Whether the `bytes` bytes at x and y (device memory) are the same, compared on the host in
// chunks once the stream's work is done (a warm-up step's: the time is the tuning's).
bool same_bytes(const void* x, const void* y, int64_t bytes, cudaStream_t stream) {
  constexpr int64_t kChunk = int64_t{8} << 20;
  std::vector<unsigned char> x_chunk(static_cast<size_t>(std::min(bytes, kChunk)));
  std::vector<unsigned char> y_chunk(x_chunk.size());
  for (int64_t offset = 0; offset < bytes; offset += kChunk) {
    const auto length = static_cast<size_t>(std::min(kChunk, bytes - offset));
    CUDA_CHECK(cudaMemcpyAsync(x_chunk.data(), static_cast<const unsigned char*>(x) + offset,
                               length, cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaMemcpyAsync(y_chunk.data(), static_cast<const unsigned char*>(y) + offset,
                               length, cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    if (std::memcmp(x_chunk.data(), y_chunk.data(), length) != 0) return false;
  }
  return true;
}

}  // namespace

void GemmPlans::matmul(const GemmKey& key, const void* a, const void* b, void* d,
                       GemmEpilogueOperands operands, float beta, cudaStream_t stream) {
  GemmPlan* plan = find(key, operands);
  if (plan == nullptr) common::fail("cuBLASLt has no algorithm for {}", describe(key));
  run(key, *plan, a, b, d, operands, beta, stream);
}

bool GemmPlans::try_matmul(const GemmKey& key, const void* a, const void* b, void* d,
                           GemmEpilogueOperands operands, float beta, cudaStream_t stream) {
  GemmPlan* plan = find(key, operands);
  if (plan == nullptr) return false;
  run(key, *plan, a, b, d, operands, beta, stream);
  return true;
}

void GemmPlans::run(const GemmKey& key, GemmPlan& plan, const void* a, const void* b, void* d,
                    GemmEpilogueOperands operands, float beta, cudaStream_t stream) {
  if (epilogue_has_bias(key.epilogue)) {
    CUBLAS_CHECK(cuda_detail::cublaslt().matmul_desc_set_attribute(
        plan.operation, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &operands.bias, sizeof(operands.bias)));
  }
  if (epilogue_has_aux(key.epilogue)) {
    CUBLAS_CHECK(cuda_detail::cublaslt().matmul_desc_set_attribute(
        plan.operation, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &operands.aux,
        sizeof(operands.aux)));
  }
  if (plan.candidate_count > 0) {
    // A capture cannot hold the tuning's waits and allocations: the first eager call tunes.
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    CUDA_CHECK(cudaStreamIsCapturing(stream, &capturing));
    if (capturing == cudaStreamCaptureStatusNone) {
      tune(key, plan, a, b, d, beta, stream);
      plan.candidate_count = 0;
    }
  }
  const float alpha = 1.0f;
  CUBLAS_CHECK(cuda_detail::cublaslt().matmul(
      handle_, plan.operation, &alpha, a, plan.a, b, plan.b, &beta, d, plan.c, d, plan.c,
      &plan.algorithm, workspace_, static_cast<size_t>(workspace_bytes_), stream));
}

GemmPlan* GemmPlans::find(const GemmKey& key, GemmEpilogueOperands operands) {
  auto found = plans_.find(key);
  if (found != plans_.end()) return &found->second;
  if (refused_.contains(key)) return nullptr;
  GemmPlan plan;
  bool built = false;
  try {
    built = build(key, operands, plan);
  } catch (...) {
    plan.release();
    throw;
  }
  if (!built) {
    plan.release();
    refused_.insert(key);
    if (key.epilogue != GemmEpilogue::none && key.epilogue != GemmEpilogue::bias) {
      spdlog::info("cuBLASLt has no algorithm for {}; the separate kernels run instead",
                   describe(key));
    }
    return nullptr;
  }
  return &plans_.emplace(key, plan).first->second;
}

bool GemmPlans::build(const GemmKey& key, GemmEpilogueOperands operands, GemmPlan& plan) {
  CUBLAS_CHECK(
      cuda_detail::cublaslt().matmul_desc_create(&plan.operation, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t op_a = key.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = key.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  CUBLAS_CHECK(cuda_detail::cublaslt().matmul_desc_set_attribute(
      plan.operation, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
  CUBLAS_CHECK(cuda_detail::cublaslt().matmul_desc_set_attribute(
      plan.operation, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
  if (key.epilogue != GemmEpilogue::none) {
    cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    switch (key.epilogue) {
      case GemmEpilogue::none:
      case GemmEpilogue::bias:
        epilogue = CUBLASLT_EPILOGUE_BIAS;
        break;
      case GemmEpilogue::gelu_aux:
        epilogue = CUBLASLT_EPILOGUE_GELU_AUX;
        break;
      case GemmEpilogue::gelu_aux_bias:
        epilogue = CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
        break;
      case GemmEpilogue::dgelu:
        epilogue = CUBLASLT_EPILOGUE_DGELU;
        break;
    }
    CUBLAS_CHECK(cuda_detail::cublaslt().matmul_desc_set_attribute(
        plan.operation, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
  }
  // The heuristic reads the epilogue pointers' alignment (cublasLt.h), so they are set here
  // as well as before every call.
  if (epilogue_has_bias(key.epilogue)) {
    // The bias has D's type (the default for fp32, bf16 and fp16 outputs), stated for
    // clarity.
    const cudaDataType_t bias_type = key.c_type;
    CUBLAS_CHECK(cuda_detail::cublaslt().matmul_desc_set_attribute(
        plan.operation, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)));
    CUBLAS_CHECK(cuda_detail::cublaslt().matmul_desc_set_attribute(
        plan.operation, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &operands.bias, sizeof(operands.bias)));
  }
  if (epilogue_has_aux(key.epilogue)) {
    // The pre-activation in D's type: the default, left unset (cublasLt.h: a type set for a
    // combination it does not take fails the matmul call itself, not the heuristic), with
    // leading dimension aux_ld.
    CUBLAS_CHECK(cuda_detail::cublaslt().matmul_desc_set_attribute(
        plan.operation, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &key.aux_ld, sizeof(key.aux_ld)));
    CUBLAS_CHECK(cuda_detail::cublaslt().matmul_desc_set_attribute(
        plan.operation, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &operands.aux,
        sizeof(operands.aux)));
  }
  const auto rows_a = static_cast<uint64_t>(key.transpose_a ? key.k : key.m);
  const auto cols_a = static_cast<uint64_t>(key.transpose_a ? key.m : key.k);
  const auto rows_b = static_cast<uint64_t>(key.transpose_b ? key.n : key.k);
  const auto cols_b = static_cast<uint64_t>(key.transpose_b ? key.k : key.n);
  CUBLAS_CHECK(cuda_detail::cublaslt().matrix_layout_create(&plan.a, key.a_type, rows_a, cols_a,
                                          static_cast<int64_t>(rows_a)));
  CUBLAS_CHECK(cuda_detail::cublaslt().matrix_layout_create(&plan.b, key.a_type, rows_b, cols_b,
                                          static_cast<int64_t>(rows_b)));
  CUBLAS_CHECK(cuda_detail::cublaslt().matrix_layout_create(
      &plan.c, key.c_type, static_cast<uint64_t>(key.m), static_cast<uint64_t>(key.n), key.m));

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
  std::array<cublasLtMatmulHeuristicResult_t, kAutotuneCandidates> results{};
  int found = 0;
  // An epilogue the library does not offer for these types is NOT_SUPPORTED rather than zero
  // results: a refusal either way.
  const cublasStatus_t status = cuda_detail::cublaslt().matmul_algo_get_heuristic(
      handle_, plan.operation, plan.a, plan.b, plan.c, plan.c, preference.handle,
      autotune_ ? kAutotuneCandidates : 1, results.data(), &found);
  if (status == CUBLAS_STATUS_NOT_SUPPORTED) return false;
  CUBLAS_CHECK(status);
  if (found == 0) return false;
  plan.algorithm = results[0].algo;
  if (autotune_ && found > 1) {
    for (int i = 0; i < found; ++i) {
      if (results[static_cast<size_t>(i)].state == CUBLAS_STATUS_SUCCESS) {
        plan.candidates[static_cast<size_t>(plan.candidate_count++)] =
            results[static_cast<size_t>(i)].algo;
      }
    }
  }
  return true;
}

bool GemmPlans::run_algorithm(const GemmPlan& plan, const cublasLtMatmulAlgo_t& algorithm,
                              const void* a, const void* b, void* d, float beta,
                              cudaStream_t stream) {
  const float alpha = 1.0f;
  return cuda_detail::cublaslt().matmul(handle_, plan.operation, &alpha, a, plan.a, b, plan.b,
                                        &beta, d, plan.c, d, plan.c, &algorithm, workspace_,
                                        static_cast<size_t>(workspace_bytes_),
                                        stream) == CUBLAS_STATUS_SUCCESS;
}

void GemmPlans::tune(const GemmKey& key, GemmPlan& plan, const void* a, const void* b,
                     const void* d, float beta, cudaStream_t stream) {
  const int64_t bytes = key.m * key.n * (key.c_type == CUDA_R_32F ? 4 : 2);
  const auto count = static_cast<size_t>(plan.candidate_count);
  if (count < 2 || bytes > kAutotuneMaxBytes) return;
  TuningScratch scratch;
  for (void** memory : {&scratch.original, &scratch.reference, &scratch.trial}) {
    CUDA_CHECK(cudaMalloc(memory, static_cast<size_t>(bytes)));
  }
  CUDA_CHECK(cudaEventCreate(&scratch.start));
  CUDA_CHECK(cudaEventCreate(&scratch.stop));
  // C = D: every trial starts from d's contents (with beta ≠ 0 they are accumulated into).
  CUDA_CHECK(cudaMemcpyAsync(scratch.original, d, static_cast<size_t>(bytes),
                             cudaMemcpyDeviceToDevice, stream));
  const auto start_from_original = [&](void* into) {
    CUDA_CHECK(cudaMemcpyAsync(into, scratch.original, static_cast<size_t>(bytes),
                               cudaMemcpyDeviceToDevice, stream));
  };
  start_from_original(scratch.reference);
  if (!run_algorithm(plan, plan.candidates[0], a, b, scratch.reference, beta, stream)) return;
  std::array<float, kAutotuneCandidates> milliseconds;
  milliseconds.fill(-1.0f);
  size_t best = 0;
  int agreeing = 0;
  for (size_t i = 0; i < count; ++i) {
    start_from_original(scratch.trial);
    if (!run_algorithm(plan, plan.candidates[i], a, b, scratch.trial, beta, stream)) continue;
    if (!same_bytes(scratch.trial, scratch.reference, bytes, stream)) continue;  // other bits
    ++agreeing;
    float fastest = std::numeric_limits<float>::infinity();
    for (int run = 0; run < kAutotuneRuns; ++run) {
      CUDA_CHECK(cudaEventRecord(scratch.start, stream));
      const bool ran = run_algorithm(plan, plan.candidates[i], a, b, scratch.trial, beta, stream);
      CUDA_CHECK(cudaEventRecord(scratch.stop, stream));
      CUDA_CHECK(cudaEventSynchronize(scratch.stop));
      if (!ran) break;
      float elapsed = 0;
      CUDA_CHECK(cudaEventElapsedTime(&elapsed, scratch.start, scratch.stop));
      fastest = std::min(fastest, elapsed);
    }
    milliseconds[i] = fastest;
    if (fastest < milliseconds[best] || milliseconds[best] < 0) best = i;
  }
  plan.algorithm = plan.candidates[best];
  spdlog::debug(
      "--gemm-autotune: {}: candidate {} of {} at {:.1f} us (the heuristic's first: {:.1f} us); "
      "{} of them give its bits",
      describe(key), best + 1, count, milliseconds[best] * 1000.0f, milliseconds[0] * 1000.0f,
      agreeing);
}

}  // namespace backend::cuda
