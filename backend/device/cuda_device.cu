// CudaDevice: the Device of one NVIDIA GPU. It owns the device index, one non-blocking stream,
// a cuBLASLt handle with its workspace and GEMM plans (linear_cuda.cu), a scratch buffer for
// the ops that need one and a small buffer of partial sums, all made at construction and
// released in the destructor: no global stream or handle, no cudaMalloc inside an op.
//
// Memory and reductions live here; each op family checks its views (GPU memory, one element
// type among fp32, bf16 and fp16, parameter gradients and statistics fp32) and calls the CUDA
// twin backend::cuda::<op> in backend/ops/<family>_cuda.cu through a launch_<op> function (the
// section "Twins" below), so wiring a twin in is one place.
//
// sum and sum_of_squares (ops/reduction_cuda.cu) use the device's buffer of partial sums; the
// optimizer's update is ops/adamw_cuda.cu.
//
// The host waits on the stream in one place only: copy_to_host (and allocate_zeroed, at setup).
// cuda_placement hands the stream to the NCCL communicator, which enqueues its collectives on it
// and waits for each (backend/dist/nccl_communicator_cuda.cu).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <string>
#include <type_traits>

#include "backend/common/error.hpp"
#include "backend/device/cuda_check.cuh"
#include "backend/device/cuda_device.hpp"
#include "backend/device/element_type.hpp"
#include "backend/ops/adamw.hpp"
#include "backend/ops/attention.hpp"
#include "backend/ops/convert.hpp"
#include "backend/ops/cross_entropy.hpp"
#include "backend/ops/dropout.hpp"
#include "backend/ops/embedding.hpp"
#include "backend/ops/gelu.hpp"
#include "backend/ops/layernorm.hpp"
#include "backend/ops/linear.hpp"
#include "backend/ops/reduction.hpp"
#include "backend/ops/residual.hpp"
#include "backend/ops/rmsnorm.hpp"
#include "backend/ops/rope.hpp"
#include "backend/ops/swiglu.hpp"

namespace backend {
namespace {

constexpr int64_t kCublasWorkspaceBytes = int64_t{32} << 20;

// ---- element types and views --------------------------------------------------------------

// Calls function(Scalar{}) with Scalar the host type of `dtype` (float, bfloat16 or float16):
// the types the GPU ops compute in. fp64 is refused by name.
template <typename Function>
void dispatch(ElementType dtype, const char* op, Function&& function) {
  switch (dtype) {
    case ElementType::f32: function(float{}); return;
    case ElementType::bf16: function(bfloat16{}); return;
    case ElementType::f16: function(float16{}); return;
    default:
      common::fail("the CUDA device computes in fp32, bf16 or fp16; {} has no {} kernel on it",
                   op, element_name(dtype));
  }
}

void check_on_gpu(View view, const char* op) {
  if (!view.empty() && view.on != MemoryKind::cuda) {
    common::fail("the CUDA device was given host memory in {} ({} elements of {}); copy it to "
                 "the device with copy_from_host first",
                 op, view.numel, element_name(view.type));
  }
}

// The view's elements as S*: GPU memory of type S (or empty: nullptr).
template <typename S>
S* gpu(View view, const char* op) {
  check_on_gpu(view, op);
  if (!view.empty() && view.type != element_type_of<S>()) {
    common::fail("{}: a view of {} where {} was expected ({} elements)", op,
                 element_name(view.type), element_name(element_type_of<S>()), view.numel);
  }
  return static_cast<S*>(view.data);
}

void release_gpu(void* data, int64_t /*bytes*/) noexcept {
  // Called from destructors: an error here cannot be thrown, and a failing cudaFree means the
  // context is already gone (process exit), where there is nothing left to release.
  (void)cudaFree(data);
}

// ---- the device ---------------------------------------------------------------------------

class CudaDevice final : public Device {
 public:
  CudaDevice(int index, const CudaDeviceOptions& options)
      : index_(index), flash_attention_(options.flash_attention) {
    int count = 0;
    CUDA_CHECK(cudaGetDeviceCount(&count));
    if (index < 0 || index >= count) {
      common::fail("--device cuda:{}: the CUDA runtime sees {} GPU(s) (after "
                   "CUDA_VISIBLE_DEVICES)",
                   index, count);
    }
    CUDA_CHECK(cudaSetDevice(index_));
    cudaDeviceProp properties{};
    CUDA_CHECK(cudaGetDeviceProperties(&properties, index_));
    name_ = "cuda:" + std::to_string(index_) + " (" + properties.name + ")";
    // From here on a failure must release what was made: the members' destructor does it.
    try {
      CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
      CUBLAS_CHECK(cuda_detail::cublaslt().create(&lt_handle_));
      workspace_ = allocate_zeroed(kCublasWorkspaceBytes, "the cuBLASLt workspace");
      partials_ = allocate_zeroed(cuda::kReductionPartials * int64_t{sizeof(double)},
                                  "the reductions' partial sums");
      scratch_ = allocate_zeroed(options.scratch_bytes, "the ops' scratch");
      plans_ = cuda::make_gemm_plans(lt_handle_, workspace_.data(), workspace_.bytes());
    } catch (...) {
      destroy();
      throw;
    }
  }
  ~CudaDevice() override { destroy(); }
  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  std::string name() const override { return name_; }
  MemoryKind memory_kind() const override { return MemoryKind::cuda; }
  // For cuda_placement (work of other libraries, NCCL's, ordered with this device's ops).
  int index() const { return index_; }
  cudaStream_t stream() const { return stream_; }

  DeviceMemory allocate_zeroed(int64_t bytes, std::string_view what) override {
    if (bytes == 0) return {};
    use();
    void* data = nullptr;
    const cudaError_t status = cudaMalloc(&data, static_cast<size_t>(bytes));
    if (status == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      size_t free_bytes = 0, total_bytes = 0;
      CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
      common::fail("out of GPU memory on {} allocating {} bytes for {}: {} of {} bytes free",
                   name_, bytes, what, free_bytes, total_bytes);
    }
    CUDA_CHECK(status);
    DeviceMemory memory(data, bytes, MemoryKind::cuda, release_gpu, &ledger_);
    CUDA_CHECK(cudaMemsetAsync(data, 0, static_cast<size_t>(bytes), stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));  // setup only: the memory is zero when returned
    return memory;
  }

  void copy_from_host(View destination, const void* source) override {
    if (destination.bytes() == 0) return;
    check_on_gpu(destination, "copy_from_host");
    use();
    // From pageable memory: the runtime stages the bytes before returning, so the caller may
    // reuse `source` at once; CUDA may do that in step with the stream (docs/device.md).
    CUDA_CHECK(cudaMemcpyAsync(destination.data, source, static_cast<size_t>(destination.bytes()),
                               cudaMemcpyHostToDevice, stream_));
  }

  void copy_to_host(void* destination, View source) override {
    if (source.bytes() == 0) return;
    check_on_gpu(source, "copy_to_host");
    use();
    CUDA_CHECK(cudaMemcpyAsync(destination, source.data, static_cast<size_t>(source.bytes()),
                               cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));  // the one place the host waits for the GPU
  }

  // On the stream, as the ops: no host wait. The same view is nothing to do (cudaMemcpy's
  // ranges must not overlap).
  void copy(View destination, View source) override {
    check_same_extent(destination, source, "copy");
    if (source.bytes() == 0) return;
    check_on_gpu(destination, "copy");
    check_on_gpu(source, "copy");
    if (destination.data == source.data) return;
    use();
    CUDA_CHECK(cudaMemcpyAsync(destination.data, source.data, static_cast<size_t>(source.bytes()),
                               cudaMemcpyDeviceToDevice, stream_));
  }

  void fill_zero(View values) override {
    if (values.bytes() == 0) return;
    check_on_gpu(values, "fill_zero");
    use();
    // All-zero bytes are +0 in every element type.
    CUDA_CHECK(cudaMemsetAsync(values.data, 0, static_cast<size_t>(values.bytes()), stream_));
  }

  void sum(View total, View values) override { reduce(total, values, Reduction::sum, "sum"); }
  void sum_of_squares(View total, View values) override {
    reduce(total, values, Reduction::sum_of_squares, "sum_of_squares");
  }
  void count_zeros(View total, View values) override {
    reduce(total, values, Reduction::count_zeros, "count_zeros");
  }
  void convert(View destination, View source) override;
  MemoryUsage memory_usage() const override { return ledger_.usage(); }
  void scale(View values, double factor) override;
  void adamw_update(View master, View weights, View gradients, View exp_avg, View exp_avg_sq,
                    const AdamWCoefficients& coefficients) override;

  void embedding_forward(View output, View tokens, View word_embeddings,
                         View position_embeddings, int64_t batch_size, int64_t seq_length,
                         int64_t hidden_size, int64_t vocab_start) override;
  void embedding_backward(View dword_embeddings, View dposition_embeddings, View doutput,
                          View token_index, int64_t batch_size, int64_t seq_length,
                          int64_t hidden_size, int64_t vocab_start) override;
  void embedding_at_positions_forward(View output, View tokens, View positions,
                                      View word_embeddings, View position_embeddings, int64_t rows,
                                      int64_t hidden_size) override;
  void dropout_forward(View output, View input, const Dropout& dropout) override;
  void dropout_backward(View dinput, View doutput, const Dropout& dropout) override;
  void layernorm_forward(View output, View mean, View rstd, View input, View weight, View bias,
                         double weight_offset, double epsilon, int64_t rows,
                         int64_t channels) override;
  void layernorm_backward(View dinput, View dweight, View dbias, View doutput, View input,
                          View weight, double weight_offset, View mean, View rstd, int64_t rows,
                          int64_t channels) override;
  void rmsnorm_forward(View output, View rstd, View input, View weight, double epsilon,
                       int64_t rows, int64_t channels) override;
  void rmsnorm_backward(View dinput, View dweight, View doutput, View input, View weight,
                        View rstd, int64_t rows, int64_t channels) override;
  void linear_forward(View output, View input, View weight, View bias, int64_t rows,
                      int64_t in_features, int64_t out_features) override;
  void linear_backward(View dinput, View dweight, View dbias, View doutput, View input,
                       View weight, int64_t rows, int64_t in_features,
                       int64_t out_features) override;
  void rope_tables(View cos, View sin, int64_t seq_length, int64_t rotary_dim, double base,
                   RopeScaling scaling) override;
  void rope_forward(View output, View input, View cos, View sin, int64_t batch_size,
                    int64_t seq_length, int64_t num_heads, int64_t head_dim, int64_t rotary_dim,
                    int64_t row_stride) override;
  void rope_at_positions_forward(View output, View input, View cos, View sin, View positions,
                                 int64_t rows, int64_t num_heads, int64_t head_dim,
                                 int64_t rotary_dim, int64_t row_stride) override;
  void rope_backward(View dinput, View doutput, View cos, View sin, int64_t batch_size,
                     int64_t seq_length, int64_t num_heads, int64_t head_dim, int64_t rotary_dim,
                     int64_t row_stride) override;
  void attention_forward(View output, View logsumexp, View qkv, int64_t batch_size,
                         int64_t seq_length, int64_t hidden_size, int64_t num_heads,
                         int64_t num_query_groups, const Dropout& dropout) override;
  void attention_backward(View dqkv, View doutput, View qkv, View output, View logsumexp,
                          int64_t batch_size, int64_t seq_length, int64_t hidden_size,
                          int64_t num_heads, int64_t num_query_groups,
                          const Dropout& dropout) override;
  void kv_cache_attention_forward(View output, View key_cache, View value_cache, View qkv,
                                  View slots, View positions, int64_t rows, int64_t num_heads,
                                  int64_t num_query_groups, int64_t head_dim,
                                  int64_t max_length) override;
  void residual_forward(View output, View input, View branch) override;
  void gelu_forward(View output, View input) override;
  void gelu_backward(View dinput, View doutput, View input) override;
  void swiglu_forward(View output, View input, int64_t rows, int64_t features) override;
  void swiglu_backward(View dinput, View doutput, View input, int64_t rows,
                       int64_t features) override;
  void cross_entropy_forward(View losses, View logsumexp, View logits, View labels, int64_t rows,
                             int64_t vocab_size) override;
  void cross_entropy_backward(View dlogits, View logits, View logsumexp, View labels,
                              double scale, int64_t rows, int64_t vocab_size,
                              int64_t vocab_start) override;
  void vocab_parallel_cross_entropy_partial(View logsumexp_part, View target_logit, View logits,
                                            View labels, int64_t rows, int64_t vocab_size,
                                            int64_t vocab_start) override;
  void vocab_parallel_cross_entropy_combine(View losses, View logsumexp, View logsumexp_parts,
                                            View target_logit, View labels, int64_t rows,
                                            int64_t parts) override;

 private:
  // Every public call starts here: a process may drive several GPUs from one thread.
  void use() const { CUDA_CHECK(cudaSetDevice(index_)); }

  enum class Reduction { sum, sum_of_squares, count_zeros };
  void reduce(View total, View values, Reduction reduction, const char* op) {
    double* result = gpu<double>(total, op);
    if (result == nullptr || total.numel != 1) common::fail("{}: the total must be one f64", op);
    check_on_gpu(values, op);
    use();
    auto* partials = static_cast<double*>(partials_.data());
    auto run = [&](const auto* data) {
      switch (reduction) {
        case Reduction::sum: cuda::sum(result, partials, data, values.numel, stream_); return;
        case Reduction::sum_of_squares:
          cuda::sum_of_squares(result, partials, data, values.numel, stream_);
          return;
        case Reduction::count_zeros:
          cuda::count_zeros(result, partials, data, values.numel, stream_);
          return;
      }
    };
    switch (values.type) {
      case ElementType::f32: run(static_cast<const float*>(values.data)); return;
      case ElementType::bf16: run(static_cast<const bfloat16*>(values.data)); return;
      case ElementType::f16: run(static_cast<const float16*>(values.data)); return;
      case ElementType::f64: run(static_cast<const double*>(values.data)); return;
      default:
        common::fail("the CUDA device reduces fp32, bf16, fp16 or fp64; {} has no {} kernel on "
                     "it",
                     op, element_name(values.type));
    }
  }

  // Whether attention of this qkv runs on tensor cores (CudaDeviceOptions::flash_attention):
  // bf16 or fp16 with a head dimension the kernel has; every other case takes the CUDA-core
  // kernel.
  bool runs_flash_attention(const View& qkv, int64_t hidden_size, int64_t num_heads) const {
    const bool sixteen_bit = qkv.type == ElementType::bf16 || qkv.type == ElementType::f16;
    return flash_attention_ && sixteen_bit && num_heads > 0 &&
           hidden_size % num_heads == 0 && cuda::flash_attention_supports(hidden_size / num_heads);
  }

  // The scratch as floats, checked against what the op needs.
  float* scratch_floats(int64_t floats, const char* op) const {
    const int64_t needed = floats * int64_t{sizeof(float)};
    if (needed > scratch_.bytes()) {
      common::fail("{} needs {} bytes of scratch on {}, which reserved {}: make the device with "
                   "make_cuda_device with CudaDeviceOptions::scratch_bytes of at least that",
                   op, needed, name_, scratch_.bytes());
    }
    return static_cast<float*>(scratch_.data());
  }

  void destroy() noexcept {
    (void)cudaSetDevice(index_);
    if (stream_ != nullptr) (void)cudaStreamSynchronize(stream_);
    plans_.reset();
    scratch_ = {};
    partials_ = {};
    workspace_ = {};
    if (lt_handle_ != nullptr) (void)cuda_detail::cublaslt().destroy(lt_handle_);
    lt_handle_ = nullptr;
    if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
    stream_ = nullptr;
  }

  int index_;
  bool flash_attention_;  // CudaDeviceOptions::flash_attention
  std::string name_;
  MemoryLedger ledger_;  // before the members it counts: they go first
  cudaStream_t stream_ = nullptr;
  cublasLtHandle_t lt_handle_ = nullptr;
  DeviceMemory workspace_;
  DeviceMemory partials_;
  DeviceMemory scratch_;
  cuda::GemmPlansPtr plans_;
};

// ---- Twins --------------------------------------------------------------------------------
// The CUDA twins of the op families (backend/ops/<family>_cuda.cu), with their convention:
// the CPU twin's parameters plus a trailing stream; parameter gradients and statistics float*;
// epsilon and scale float.

template <typename S>
void launch_embedding_forward(S* output, const int32_t* tokens, const S* word, const S* position,
                              int64_t B, int64_t T, int64_t C, int64_t vocab_start,
                              int64_t vocab_size, cudaStream_t stream) {
  cuda::embedding_forward(output, tokens, word, position, B, T, C, vocab_start, vocab_size,
                          stream);
}
template <typename S>
void launch_embedding_backward(float* dword, float* dposition, const S* doutput,
                               const int32_t* token_index, int64_t B, int64_t T, int64_t C,
                               int64_t vocab_start, int64_t vocab_size, cudaStream_t stream) {
  cuda::embedding_backward(dword, dposition, doutput, token_index, B, T, C, vocab_start,
                           vocab_size, stream);
}
template <typename S>
void launch_dropout_forward(S* output, const S* input, int64_t count, const Dropout& dropout,
                            cudaStream_t stream) {
  cuda::dropout_forward(output, input, count, dropout, stream);
}
template <typename S>
void launch_dropout_backward(S* dinput, const S* doutput, int64_t count, const Dropout& dropout,
                             cudaStream_t stream) {
  cuda::dropout_backward(dinput, doutput, count, dropout, stream);
}
template <typename S>
void launch_layernorm_forward(S* output, float* mean, float* rstd, const S* input, const S* weight,
                              const S* bias, float weight_offset, float epsilon, int64_t N,
                              int64_t C, cudaStream_t stream) {
  cuda::layernorm_forward(output, mean, rstd, input, weight, bias, weight_offset, epsilon, N, C,
                          stream);
}
template <typename S>
void launch_layernorm_backward(S* dinput, float* dweight, float* dbias, const S* doutput,
                               const S* input, const S* weight, float weight_offset,
                               const float* mean, const float* rstd, int64_t N, int64_t C,
                               float* scratch, cudaStream_t stream) {
  cuda::layernorm_backward(dinput, dweight, dbias, doutput, input, weight, weight_offset, mean,
                           rstd, N, C, scratch, stream);
}
template <typename S>
void launch_rmsnorm_forward(S* output, float* rstd, const S* input, const S* weight, float epsilon,
                            int64_t N, int64_t C, cudaStream_t stream) {
  cuda::rmsnorm_forward(output, rstd, input, weight, epsilon, N, C, stream);
}
template <typename S>
void launch_rmsnorm_backward(S* dinput, float* dweight, const S* doutput, const S* input,
                             const S* weight, const float* rstd, int64_t N, int64_t C,
                             float* scratch, cudaStream_t stream) {
  cuda::rmsnorm_backward(dinput, dweight, doutput, input, weight, rstd, N, C, scratch, stream);
}
void launch_rope_tables(float* cos, float* sin, int64_t T, int64_t R, double base,
                        RopeScaling scaling, cudaStream_t stream) {
  cuda::rope_tables(cos, sin, T, R, base, scaling, stream);
}
template <typename S>
void launch_rope_forward(S* output, const S* input, const float* cos, const float* sin, int64_t B,
                         int64_t T, int64_t H, int64_t HD, int64_t R, int64_t row_stride,
                         cudaStream_t stream) {
  cuda::rope_forward(output, input, cos, sin, B, T, H, HD, R, row_stride, stream);
}
template <typename S>
void launch_rope_backward(S* dinput, const S* doutput, const float* cos, const float* sin,
                          int64_t B, int64_t T, int64_t H, int64_t HD, int64_t R,
                          int64_t row_stride, cudaStream_t stream) {
  cuda::rope_backward(dinput, doutput, cos, sin, B, T, H, HD, R, row_stride, stream);
}
template <typename S>
void launch_residual_forward(S* output, const S* input, const S* branch, int64_t count,
                             cudaStream_t stream) {
  cuda::residual_forward(output, input, branch, count, stream);
}
template <typename S>
void launch_gelu_forward(S* output, const S* input, int64_t count, cudaStream_t stream) {
  cuda::gelu_forward(output, input, count, stream);
}
template <typename S>
void launch_gelu_backward(S* dinput, const S* doutput, const S* input, int64_t count,
                          cudaStream_t stream) {
  cuda::gelu_backward(dinput, doutput, input, count, stream);
}
template <typename S>
void launch_swiglu_forward(S* output, const S* input, int64_t N, int64_t F, cudaStream_t stream) {
  cuda::swiglu_forward(output, input, N, F, stream);
}
template <typename S>
void launch_swiglu_backward(S* dinput, const S* doutput, const S* input, int64_t N, int64_t F,
                            cudaStream_t stream) {
  cuda::swiglu_backward(dinput, doutput, input, N, F, stream);
}
template <typename S>
void launch_cross_entropy_forward(float* losses, float* logsumexp, const S* logits,
                                  const int32_t* labels, int64_t N, int64_t V,
                                  cudaStream_t stream) {
  cuda::cross_entropy_forward(losses, logsumexp, logits, labels, N, V, stream);
}
template <typename S>
void launch_cross_entropy_backward(S* dlogits, const S* logits, const float* logsumexp,
                                   const int32_t* labels, float scale, int64_t N, int64_t V,
                                   int64_t vocab_start, cudaStream_t stream) {
  cuda::cross_entropy_backward(dlogits, logits, logsumexp, labels, scale, N, V, vocab_start,
                               stream);
}
template <typename S>
void launch_vocab_parallel_cross_entropy_partial(float* logsumexp_part, float* target_logit,
                                                 const S* logits, const int32_t* labels,
                                                 int64_t N, int64_t V, int64_t vocab_start,
                                                 cudaStream_t stream) {
  cuda::vocab_parallel_cross_entropy_partial(logsumexp_part, target_logit, logits, labels, N, V,
                                             vocab_start, stream);
}
void launch_vocab_parallel_cross_entropy_combine(float* losses, float* logsumexp,
                                                 const float* logsumexp_parts,
                                                 const float* target_logit,
                                                 const int32_t* labels, int64_t N, int64_t parts,
                                                 cudaStream_t stream) {
  cuda::vocab_parallel_cross_entropy_combine(losses, logsumexp, logsumexp_parts, target_logit,
                                             labels, N, parts, stream);
}

// ---- ops: views checked, then the twin of the element type --------------------------------

const int32_t* ids(View view, const char* op) { return gpu<int32_t>(view, op); }

void CudaDevice::embedding_forward(View output, View tokens, View word_embeddings,
                                   View position_embeddings, int64_t batch_size,
                                   int64_t seq_length, int64_t hidden_size, int64_t vocab_start) {
  constexpr const char* op = "embedding_forward";
  use();
  const int64_t vocab_size = embedding_table_rows(word_embeddings.numel, hidden_size, op);
  dispatch(output.type, op, [&](auto s) {
    using S = decltype(s);
    launch_embedding_forward(gpu<S>(output, op), ids(tokens, op), gpu<S>(word_embeddings, op),
                             gpu<S>(position_embeddings, op), batch_size, seq_length,
                             hidden_size, vocab_start, vocab_size, stream_);
  });
}

void CudaDevice::embedding_backward(View dword_embeddings, View dposition_embeddings,
                                    View doutput, View token_index, int64_t batch_size,
                                    int64_t seq_length, int64_t hidden_size,
                                    int64_t vocab_start) {
  constexpr const char* op = "embedding_backward";
  use();
  const int64_t vocab_size = embedding_table_rows(dword_embeddings.numel, hidden_size, op);
  check_token_index(token_index.numel, batch_size * seq_length, op);
  dispatch(doutput.type, op, [&](auto s) {
    using S = decltype(s);
    launch_embedding_backward(gpu<float>(dword_embeddings, op),
                              gpu<float>(dposition_embeddings, op), gpu<S>(doutput, op),
                              ids(token_index, op), batch_size, seq_length, hidden_size,
                              vocab_start, vocab_size, stream_);
  });
}

void CudaDevice::embedding_at_positions_forward(View output, View tokens, View positions,
                                                View word_embeddings, View position_embeddings,
                                                int64_t rows, int64_t hidden_size) {
  constexpr const char* op = "embedding_at_positions_forward";
  use();
  dispatch(output.type, op, [&](auto s) {
    using S = decltype(s);
    cuda::embedding_at_positions_forward(gpu<S>(output, op), ids(tokens, op), ids(positions, op),
                                         gpu<S>(word_embeddings, op),
                                         gpu<S>(position_embeddings, op), rows, hidden_size,
                                         stream_);
  });
}

void CudaDevice::dropout_forward(View output, View input, const Dropout& dropout) {
  constexpr const char* op = "dropout_forward";
  use();
  dispatch(input.type, op, [&](auto s) {
    using S = decltype(s);
    launch_dropout_forward(gpu<S>(output, op), gpu<S>(input, op), input.numel, dropout, stream_);
  });
}

void CudaDevice::dropout_backward(View dinput, View doutput, const Dropout& dropout) {
  constexpr const char* op = "dropout_backward";
  use();
  dispatch(doutput.type, op, [&](auto s) {
    using S = decltype(s);
    launch_dropout_backward(gpu<S>(dinput, op), gpu<S>(doutput, op), doutput.numel, dropout,
                            stream_);
  });
}

void CudaDevice::layernorm_forward(View output, View mean, View rstd, View input, View weight,
                                   View bias, double weight_offset, double epsilon, int64_t rows,
                                   int64_t channels) {
  constexpr const char* op = "layernorm_forward";
  use();
  dispatch(input.type, op, [&](auto s) {
    using S = decltype(s);
    launch_layernorm_forward(gpu<S>(output, op), gpu<float>(mean, op), gpu<float>(rstd, op),
                             gpu<S>(input, op), gpu<S>(weight, op), gpu<S>(bias, op),
                             static_cast<float>(weight_offset), static_cast<float>(epsilon), rows,
                             channels, stream_);
  });
}

void CudaDevice::layernorm_backward(View dinput, View dweight, View dbias, View doutput,
                                    View input, View weight, double weight_offset, View mean,
                                    View rstd, int64_t rows, int64_t channels) {
  constexpr const char* op = "layernorm_backward";
  use();
  dispatch(input.type, op, [&](auto s) {
    using S = decltype(s);
    float* scratch = scratch_floats(cuda::layernorm_backward_scratch_floats(rows, channels), op);
    launch_layernorm_backward(gpu<S>(dinput, op), gpu<float>(dweight, op),
                              gpu<float>(dbias, op), gpu<S>(doutput, op), gpu<S>(input, op),
                              gpu<S>(weight, op), static_cast<float>(weight_offset),
                              gpu<float>(mean, op), gpu<float>(rstd, op), rows, channels, scratch,
                              stream_);
  });
}

void CudaDevice::rmsnorm_forward(View output, View rstd, View input, View weight,
                                 double epsilon, int64_t rows, int64_t channels) {
  constexpr const char* op = "rmsnorm_forward";
  use();
  dispatch(input.type, op, [&](auto s) {
    using S = decltype(s);
    launch_rmsnorm_forward(gpu<S>(output, op), gpu<float>(rstd, op), gpu<S>(input, op),
                           gpu<S>(weight, op), static_cast<float>(epsilon), rows, channels,
                           stream_);
  });
}

void CudaDevice::rmsnorm_backward(View dinput, View dweight, View doutput, View input,
                                  View weight, View rstd, int64_t rows, int64_t channels) {
  constexpr const char* op = "rmsnorm_backward";
  use();
  dispatch(input.type, op, [&](auto s) {
    using S = decltype(s);
    float* scratch = scratch_floats(cuda::rmsnorm_backward_scratch_floats(rows, channels), op);
    launch_rmsnorm_backward(gpu<S>(dinput, op), gpu<float>(dweight, op), gpu<S>(doutput, op),
                            gpu<S>(input, op), gpu<S>(weight, op), gpu<float>(rstd, op), rows,
                            channels, scratch, stream_);
  });
}

void CudaDevice::linear_forward(View output, View input, View weight, View bias, int64_t rows,
                                int64_t in_features, int64_t out_features) {
  constexpr const char* op = "linear_forward";
  use();
  dispatch(input.type, op, [&](auto s) {
    using S = decltype(s);
    cuda::linear_forward(gpu<S>(output, op), gpu<S>(input, op), gpu<S>(weight, op),
                         gpu<S>(bias, op), rows, in_features, out_features, *plans_, stream_);
  });
}

void CudaDevice::linear_backward(View dinput, View dweight, View dbias, View doutput, View input,
                                 View weight, int64_t rows, int64_t in_features,
                                 int64_t out_features) {
  constexpr const char* op = "linear_backward";
  use();
  dispatch(input.type, op, [&](auto s) {
    using S = decltype(s);
    cuda::linear_backward(gpu<S>(dinput, op), gpu<float>(dweight, op), gpu<float>(dbias, op),
                          gpu<S>(doutput, op), gpu<S>(input, op), gpu<S>(weight, op), rows,
                          in_features, out_features, *plans_, stream_);
  });
}

void CudaDevice::rope_tables(View cos, View sin, int64_t seq_length, int64_t rotary_dim,
                             double base, RopeScaling scaling) {
  constexpr const char* op = "rope_tables";
  use();
  launch_rope_tables(gpu<float>(cos, op), gpu<float>(sin, op), seq_length, rotary_dim, base,
                     scaling, stream_);
}

void CudaDevice::rope_forward(View output, View input, View cos, View sin, int64_t batch_size,
                              int64_t seq_length, int64_t num_heads, int64_t head_dim,
                              int64_t rotary_dim, int64_t row_stride) {
  constexpr const char* op = "rope_forward";
  use();
  dispatch(input.type, op, [&](auto s) {
    using S = decltype(s);
    launch_rope_forward(gpu<S>(output, op), gpu<S>(input, op), gpu<float>(cos, op),
                        gpu<float>(sin, op), batch_size, seq_length, num_heads, head_dim,
                        rotary_dim, row_stride, stream_);
  });
}

void CudaDevice::rope_at_positions_forward(View output, View input, View cos, View sin,
                                           View positions, int64_t rows, int64_t num_heads,
                                           int64_t head_dim, int64_t rotary_dim,
                                           int64_t row_stride) {
  constexpr const char* op = "rope_at_positions_forward";
  use();
  dispatch(input.type, op, [&](auto s) {
    using S = decltype(s);
    cuda::rope_at_positions_forward(gpu<S>(output, op), gpu<S>(input, op), gpu<float>(cos, op),
                                    gpu<float>(sin, op), ids(positions, op), rows, num_heads,
                                    head_dim, rotary_dim, row_stride, stream_);
  });
}

void CudaDevice::rope_backward(View dinput, View doutput, View cos, View sin, int64_t batch_size,
                               int64_t seq_length, int64_t num_heads, int64_t head_dim,
                               int64_t rotary_dim, int64_t row_stride) {
  constexpr const char* op = "rope_backward";
  use();
  dispatch(doutput.type, op, [&](auto s) {
    using S = decltype(s);
    launch_rope_backward(gpu<S>(dinput, op), gpu<S>(doutput, op), gpu<float>(cos, op),
                         gpu<float>(sin, op), batch_size, seq_length, num_heads, head_dim,
                         rotary_dim, row_stride, stream_);
  });
}

void CudaDevice::attention_forward(View output, View logsumexp, View qkv, int64_t batch_size,
                                   int64_t seq_length, int64_t hidden_size, int64_t num_heads,
                                   int64_t num_query_groups, const Dropout& dropout) {
  constexpr const char* op = "attention_forward";
  check_attention_dropout(dropout, op);
  use();
  if (runs_flash_attention(qkv, hidden_size, num_heads)) {
    dispatch(qkv.type, op, [&](auto s) {
      using S = decltype(s);
      if constexpr (!std::is_same_v<S, float>) {
        cuda::flash_attention_forward(gpu<S>(output, op), gpu<float>(logsumexp, op),
                                      gpu<S>(qkv, op), batch_size, seq_length, hidden_size,
                                      num_heads, num_query_groups, dropout, stream_);
      }
    });
    return;
  }
  dispatch(qkv.type, op, [&](auto s) {
    using S = decltype(s);
    cuda::attention_forward(gpu<S>(output, op), gpu<float>(logsumexp, op), gpu<S>(qkv, op),
                            batch_size, seq_length, hidden_size, num_heads, num_query_groups,
                            dropout, stream_);
  });
}

void CudaDevice::attention_backward(View dqkv, View doutput, View qkv, View output,
                                    View logsumexp, int64_t batch_size, int64_t seq_length,
                                    int64_t hidden_size, int64_t num_heads,
                                    int64_t num_query_groups, const Dropout& dropout) {
  constexpr const char* op = "attention_backward";
  check_attention_dropout(dropout, op);
  use();
  if (runs_flash_attention(qkv, hidden_size, num_heads)) {
    dispatch(qkv.type, op, [&](auto s) {
      using S = decltype(s);
      if constexpr (!std::is_same_v<S, float>) {
        cuda::flash_attention_backward(gpu<S>(dqkv, op), gpu<S>(doutput, op), gpu<S>(qkv, op),
                                       gpu<S>(output, op), gpu<float>(logsumexp, op),
                                       batch_size, seq_length, hidden_size, num_heads,
                                       num_query_groups, dropout, stream_);
      }
    });
    return;
  }
  dispatch(qkv.type, op, [&](auto s) {
    using S = decltype(s);
    cuda::attention_backward(gpu<S>(dqkv, op), gpu<S>(doutput, op), gpu<S>(qkv, op),
                             gpu<S>(output, op), gpu<float>(logsumexp, op), batch_size,
                             seq_length, hidden_size, num_heads, num_query_groups, dropout,
                             stream_);
  });
}

void CudaDevice::kv_cache_attention_forward(View output, View key_cache, View value_cache,
                                            View qkv, View slots, View positions, int64_t rows,
                                            int64_t num_heads, int64_t num_query_groups,
                                            int64_t head_dim, int64_t max_length) {
  constexpr const char* op = "kv_cache_attention_forward";
  use();
  dispatch(qkv.type, op, [&](auto s) {
    using S = decltype(s);
    cuda::kv_cache_attention_forward(gpu<S>(output, op), gpu<S>(key_cache, op),
                                     gpu<S>(value_cache, op), gpu<S>(qkv, op), ids(slots, op),
                                     ids(positions, op), rows, num_heads, num_query_groups,
                                     head_dim, max_length, stream_);
  });
}

void CudaDevice::convert(View destination, View source) {
  constexpr const char* op = "convert";
  check_convertible(destination, source, op);
  use();
  if (destination.type == ElementType::f16) {
    cuda::convert(gpu<float16>(destination, op), gpu<float>(source, op), source.numel, stream_);
  } else {
    cuda::convert(gpu<bfloat16>(destination, op), gpu<float>(source, op), source.numel, stream_);
  }
}

void CudaDevice::scale(View values, double factor) {
  constexpr const char* op = "scale";
  use();
  dispatch(values.type, op, [&](auto s) {
    using S = decltype(s);
    cuda::scale(gpu<S>(values, op), factor, values.numel, stream_);
  });
}

void CudaDevice::adamw_update(View master, View weights, View gradients, View exp_avg,
                              View exp_avg_sq, const AdamWCoefficients& coefficients) {
  constexpr const char* op = "adamw_update";
  use();
  const int64_t count = master.numel;
  for (const View* view : {&gradients, &exp_avg, &exp_avg_sq}) {
    if (view->numel != count) {
      common::fail("{}: {} master weights but a view of {} elements", op, count, view->numel);
    }
  }
  float* master_data = gpu<float>(master, op);
  const float* gradient_data = gpu<float>(gradients, op);
  float* m = gpu<float>(exp_avg, op);
  float* v = gpu<float>(exp_avg_sq, op);
  if (weights.empty()) {
    cuda::adamw_update<float>(master_data, nullptr, gradient_data, m, v, count, coefficients,
                              stream_);
    return;
  }
  if (weights.numel != count) {
    common::fail("{}: {} master weights but {} working weights", op, count, weights.numel);
  }
  if (weights.type == ElementType::f16) {
    cuda::adamw_update(master_data, gpu<float16>(weights, op), gradient_data, m, v, count,
                       coefficients, stream_);
  } else {
    cuda::adamw_update(master_data, gpu<bfloat16>(weights, op), gradient_data, m, v, count,
                       coefficients, stream_);
  }
}

void CudaDevice::residual_forward(View output, View input, View branch) {
  constexpr const char* op = "residual_forward";
  use();
  dispatch(input.type, op, [&](auto s) {
    using S = decltype(s);
    launch_residual_forward(gpu<S>(output, op), gpu<S>(input, op), gpu<S>(branch, op),
                            input.numel, stream_);
  });
}

void CudaDevice::gelu_forward(View output, View input) {
  constexpr const char* op = "gelu_forward";
  use();
  dispatch(input.type, op, [&](auto s) {
    using S = decltype(s);
    launch_gelu_forward(gpu<S>(output, op), gpu<S>(input, op), input.numel, stream_);
  });
}

void CudaDevice::gelu_backward(View dinput, View doutput, View input) {
  constexpr const char* op = "gelu_backward";
  use();
  dispatch(input.type, op, [&](auto s) {
    using S = decltype(s);
    launch_gelu_backward(gpu<S>(dinput, op), gpu<S>(doutput, op), gpu<S>(input, op),
                         input.numel, stream_);
  });
}

void CudaDevice::swiglu_forward(View output, View input, int64_t rows, int64_t features) {
  constexpr const char* op = "swiglu_forward";
  use();
  dispatch(input.type, op, [&](auto s) {
    using S = decltype(s);
    launch_swiglu_forward(gpu<S>(output, op), gpu<S>(input, op), rows, features, stream_);
  });
}

void CudaDevice::swiglu_backward(View dinput, View doutput, View input, int64_t rows,
                                 int64_t features) {
  constexpr const char* op = "swiglu_backward";
  use();
  dispatch(input.type, op, [&](auto s) {
    using S = decltype(s);
    launch_swiglu_backward(gpu<S>(dinput, op), gpu<S>(doutput, op), gpu<S>(input, op), rows,
                           features, stream_);
  });
}

void CudaDevice::cross_entropy_forward(View losses, View logsumexp, View logits, View labels,
                                       int64_t rows, int64_t vocab_size) {
  constexpr const char* op = "cross_entropy_forward";
  use();
  dispatch(logits.type, op, [&](auto s) {
    using S = decltype(s);
    launch_cross_entropy_forward(gpu<float>(losses, op), gpu<float>(logsumexp, op),
                                 gpu<S>(logits, op), ids(labels, op), rows, vocab_size, stream_);
  });
}

void CudaDevice::cross_entropy_backward(View dlogits, View logits, View logsumexp, View labels,
                                        double scale, int64_t rows, int64_t vocab_size,
                                        int64_t vocab_start) {
  constexpr const char* op = "cross_entropy_backward";
  use();
  dispatch(logits.type, op, [&](auto s) {
    using S = decltype(s);
    launch_cross_entropy_backward(gpu<S>(dlogits, op), gpu<S>(logits, op),
                                  gpu<float>(logsumexp, op), ids(labels, op),
                                  static_cast<float>(scale), rows, vocab_size, vocab_start,
                                  stream_);
  });
}

void CudaDevice::vocab_parallel_cross_entropy_partial(View logsumexp_part, View target_logit,
                                                      View logits, View labels, int64_t rows,
                                                      int64_t vocab_size, int64_t vocab_start) {
  constexpr const char* op = "vocab_parallel_cross_entropy_partial";
  use();
  dispatch(logits.type, op, [&](auto s) {
    using S = decltype(s);
    launch_vocab_parallel_cross_entropy_partial(gpu<float>(logsumexp_part, op),
                                                gpu<float>(target_logit, op), gpu<S>(logits, op),
                                                ids(labels, op), rows, vocab_size, vocab_start,
                                                stream_);
  });
}

void CudaDevice::vocab_parallel_cross_entropy_combine(View losses, View logsumexp,
                                                      View logsumexp_parts, View target_logit,
                                                      View labels, int64_t rows, int64_t parts) {
  constexpr const char* op = "vocab_parallel_cross_entropy_combine";
  check_logsumexp_parts(logsumexp_parts.numel, rows, parts, op);
  use();
  // fp32 whatever the logits' type: no dispatch, the views are checked to be f32.
  launch_vocab_parallel_cross_entropy_combine(gpu<float>(losses, op), gpu<float>(logsumexp, op),
                                              gpu<float>(logsumexp_parts, op),
                                              gpu<float>(target_logit, op), ids(labels, op), rows,
                                              parts, stream_);
}

}  // namespace

std::unique_ptr<Device> make_cuda_device(int index, const CudaDeviceOptions& options) {
  return std::make_unique<CudaDevice>(index, options);
}

CudaPlacement cuda_placement(Device& device) {
  const auto* cuda_device = dynamic_cast<const CudaDevice*>(&device);
  if (cuda_device == nullptr) {
    common::fail("{} is not a CUDA device: GPU work outside its ops (NCCL's collectives) needs "
                 "a device that make_cuda_device made", device.name());
  }
  return {.index = cuda_device->index(), .stream = cuda_device->stream()};
}

}  // namespace backend
