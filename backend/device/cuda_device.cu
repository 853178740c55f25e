// CudaDevice: the Device of one NVIDIA GPU. It owns the device index, one non-blocking stream,
// a cuBLASLt handle with its workspace and GEMM plans (gemm_plans.cuh), under
// --attention-backend fused or auto a cuDNN handle with its plans (cudnn_graph.cuh), and a
// scratch buffer for the ops that need one, all made at construction and released in the
// destructor: no global stream or handle, no cudaMalloc inside an op. The ops reach the stream and
// handles through cuda_context (each op's CUDA twin is called by its family, backend/ops/).
//
// The host waits on the stream in three places only: copy_to_host, synchronize and wait_for (and
// allocate_zeroed, at setup). Marks are events recorded on the stream from a ring made with the
// device: a mark's event may since have been recorded again, later in the stream, and waiting
// for that later point is waiting for more than asked, never less.
// Capture is CUDA's stream capture (thread-local mode: this thread's calls that a capture cannot
// hold fail instead of being made), instantiated into a graph that replay() launches on the
// stream; the device refuses by name what would invalidate a capture (device.hpp).
// cuda_placement hands the stream to the NCCL communicator, which enqueues its collectives on it
// and waits for each (backend/dist/nccl_communicator_cuda.cu).
#include <cuda_runtime.h>

#include <array>
#include <memory>
#include <string>

#include "backend/common/error.hpp"
#include "backend/core/cuda_check.cuh"
#include "backend/device/cublaslt_library.cuh"
#include "backend/device/cuda_device.hpp"
#if BACKEND_BUILT_WITH_CUDNN
#include "backend/device/cudnn_graph.cuh"
#else
namespace backend::cuda {
class CudnnPlans {};  // a build without cuDNN makes none
}  // namespace backend::cuda
#endif
#include "backend/device/gemm_plans.cuh"

namespace backend {
namespace {

constexpr int64_t kCublasWorkspaceBytes = int64_t{32} << 20;
// Marks in flight before an event is recorded again: the upload ring's (three a micro batch)
// between a step's scalar mark and its read one step later.
constexpr int kMarkEvents = 256;

void release_gpu(void* data, int64_t /*bytes*/) noexcept {
  // Called from destructors: an error here cannot be thrown, and a failing cudaFree means the
  // context is already gone (process exit), where there is nothing left to release.
  (void)cudaFree(data);
}

void release_pinned_host(void* data, int64_t /*bytes*/) noexcept {
  (void)cudaFreeHost(data);
}

// ---- captured work ---------------------------------------------------------------------------

// A captured stream's graph, instantiated once, launched on the device's stream (which must
// outlive it: the trainer drops its graphs before its device).
class CudaGraph final : public DeviceGraph {
 public:
  CudaGraph(int index, cudaStream_t stream, cudaGraph_t graph)
      : index_(index), stream_(stream), graph_(graph) {
    try {
      size_t count = 0;
      CUDA_CHECK(cudaGraphGetNodes(graph_, nullptr, &count));
      nodes_ = static_cast<int64_t>(count);
      CUDA_CHECK(cudaGraphInstantiate(&executable_, graph_, 0));
    } catch (...) {
      destroy();
      throw;
    }
  }
  ~CudaGraph() override { destroy(); }
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;

  void replay() override {
    CUDA_CHECK(cudaSetDevice(index_));
    CUDA_CHECK(cudaGraphLaunch(executable_, stream_));
  }
  int64_t nodes() const override { return nodes_; }

 private:
  void destroy() noexcept {
    if (executable_ != nullptr) (void)cudaGraphExecDestroy(executable_);
    executable_ = nullptr;
    if (graph_ != nullptr) (void)cudaGraphDestroy(graph_);
    graph_ = nullptr;
  }

  int index_;
  cudaStream_t stream_;
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t executable_ = nullptr;
  int64_t nodes_ = 0;
};

// ---- the device ---------------------------------------------------------------------------

// The device's cuDNN plans: for fused, as for auto, a cuDNN that cannot be loaded or started is
// an error here (the trainer loads cuDNN first and picks flash where auto would fail).
std::unique_ptr<cuda::CudnnPlans> make_cudnn_plans([[maybe_unused]] Device& device,
                                                   [[maybe_unused]] int index,
                                                   [[maybe_unused]] cudaStream_t stream,
                                                   AttentionBackend backend) {
#if BACKEND_BUILT_WITH_CUDNN
  (void)backend;
  return std::make_unique<cuda::CudnnPlans>(index, stream,
                                            [&device](int64_t bytes, std::string_view what) {
                                              return device.allocate_zeroed(bytes, what);
                                            });
#else
  if (backend == AttentionBackend::fused) {
    common::fail(
        "--attention-backend fused needs cuDNN, and this build has none (configure "
        "with cuDNN 9's headers and library); --attention-backend flash runs without");
  }
  return nullptr;
#endif
}

class CudaDevice final : public Device {
 public:
  CudaDevice(int index, const CudaDeviceOptions& options) : index_(index) {
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
      for (cudaEvent_t& event : mark_events_) {
        CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
      }
      CUBLAS_CHECK(cuda_detail::cublaslt().create(&lt_handle_));
      workspace_ = allocate_zeroed(kCublasWorkspaceBytes, "the cuBLASLt workspace");
      scratch_ = allocate_zeroed(options.scratch_bytes, "the ops' scratch");
      plans_ = std::make_unique<cuda::GemmPlans>(lt_handle_, workspace_.data(), workspace_.bytes(),
                                                 options.gemm_autotune);
      if (uses_cudnn(options.attention_backend)) {
        cudnn_plans_ = make_cudnn_plans(*this, index_, stream_, options.attention_backend);
      }
      context_ = {.index = index_,
                  .stream = stream_,
                  .gemm_plans = plans_.get(),
                  .cudnn_plans = cudnn_plans_.get(),
                  .attention_backend = options.attention_backend};
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
    refuse_in_capture("allocate_zeroed");
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

  // Page-locked (cudaHostAlloc): the copy engines read and write it directly, so a copy from
  // it is queued without the runtime's own staging.
  DeviceMemory allocate_pinned_host(int64_t bytes, std::string_view what) override {
    refuse_in_capture("allocate_pinned_host");
    if (bytes == 0) return {};
    use();
    void* data = nullptr;
    const cudaError_t status =
        cudaHostAlloc(&data, static_cast<size_t>(bytes), cudaHostAllocDefault);
    if (status == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      common::fail("out of page-locked host memory on {} allocating {} bytes for {}", name_, bytes,
                   what);
    }
    CUDA_CHECK(status);
    return DeviceMemory(data, bytes, MemoryKind::host, release_pinned_host);
  }

  void synchronize() override {
    refuse_in_capture("synchronize");
    use();
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  DeviceMark mark() override {
    refuse_in_capture("mark");
    use();
    const uint64_t sequence = ++marks_;
    CUDA_CHECK(cudaEventRecord(mark_event(sequence), stream_));
    return {sequence};
  }

  void wait_for(DeviceMark mark) override {
    refuse_in_capture("wait_for");
    if (mark.sequence == 0) return;
    if (mark.sequence > marks_) {
      common::fail("wait_for: mark {} of {} was never made (it made {})", mark.sequence, name_,
                   marks_);
    }
    use();
    CUDA_CHECK(cudaEventSynchronize(mark_event(mark.sequence)));
  }

  void copy_from_host(View destination, const void* source) override {
    refuse_in_capture("copy_from_host");
    if (destination.bytes() == 0) return;
    check_on_gpu(destination, "copy_from_host");
    use();
    // From pageable memory: the runtime stages the bytes before returning, so the caller may
    // reuse `source` at once; CUDA may do that in step with the stream (docs/device.md). From
    // page-locked memory the copy is only queued (device.hpp: synchronize before rewriting it).
    CUDA_CHECK(cudaMemcpyAsync(destination.data, source, static_cast<size_t>(destination.bytes()),
                               cudaMemcpyHostToDevice, stream_));
  }

  void copy_to_host(void* destination, View source) override {
    refuse_in_capture("copy_to_host");
    if (source.bytes() == 0) return;
    queue_device_to_host(destination, source, "copy_to_host");
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  // Into page-locked memory the copy engine writes directly: only queued. (Into pageable
  // memory CUDA would copy in step with the host: correct, only slower.)
  void queue_copy_to_host(void* destination, View source) override {
    refuse_in_capture("queue_copy_to_host");
    if (source.bytes() == 0) return;
    queue_device_to_host(destination, source, "queue_copy_to_host");
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

  MemoryUsage memory_usage() const override { return ledger_.usage(); }

  // The scratch, checked against what the op needs.
  void* scratch(int64_t bytes, std::string_view op) override {
    if (bytes > scratch_.bytes()) {
      common::fail("{} needs {} bytes of scratch on {}, which reserved {}: make the device with "
                   "make_cuda_device with CudaDeviceOptions::scratch_bytes of at least that",
                   op, bytes, name_, scratch_.bytes());
    }
    return scratch_.data();
  }

  const CudaContext& cuda_context() override {
    use();
    return context_;
  }

  void begin_capture() override {
    if (capturing_) common::fail("begin_capture: {} is capturing already", name_);
    use();
    CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    capturing_ = true;
  }

  // An invalidated capture (an unsupported call was made on the stream during it) ends with no
  // graph: common::Error with the runtime's reason, the device no longer capturing.
  std::unique_ptr<DeviceGraph> end_capture() override {
    if (!capturing_) common::fail("end_capture: {} is not capturing", name_);
    use();
    capturing_ = false;
    cudaGraph_t graph = nullptr;
    const cudaError_t status = cudaStreamEndCapture(stream_, &graph);
    if (status != cudaSuccess || graph == nullptr) {
      (void)cudaGetLastError();
      if (graph != nullptr) (void)cudaGraphDestroy(graph);
      common::fail("end_capture on {}: the stream capture was invalidated: {}", name_,
                   cudaGetErrorString(status));
    }
    return std::make_unique<CudaGraph>(index_, stream_, graph);
  }

  void abandon_capture() noexcept override {
    if (!capturing_) return;
    capturing_ = false;
    (void)cudaSetDevice(index_);
    cudaGraph_t graph = nullptr;
    (void)cudaStreamEndCapture(stream_, &graph);
    if (graph != nullptr) (void)cudaGraphDestroy(graph);
    (void)cudaGetLastError();
  }

  bool capturing() const override { return capturing_; }

 private:
  // Every public call starts here: a process may drive several GPUs from one thread.
  void use() const { CUDA_CHECK(cudaSetDevice(index_)); }
  void queue_device_to_host(void* destination, View source, const char* call) {
    check_on_gpu(source, call);
    use();
    CUDA_CHECK(cudaMemcpyAsync(destination, source.data, static_cast<size_t>(source.bytes()),
                               cudaMemcpyDeviceToHost, stream_));
  }
  cudaEvent_t mark_event(uint64_t sequence) const {
    return mark_events_[static_cast<size_t>(sequence % kMarkEvents)];
  }

  void destroy() noexcept {
    abandon_capture();
    (void)cudaSetDevice(index_);
    if (stream_ != nullptr) (void)cudaStreamSynchronize(stream_);
    plans_.reset();
    cudnn_plans_.reset();
    scratch_ = {};
    workspace_ = {};
    if (lt_handle_ != nullptr) (void)cuda_detail::cublaslt().destroy(lt_handle_);
    lt_handle_ = nullptr;
    for (cudaEvent_t& event : mark_events_) {
      if (event != nullptr) (void)cudaEventDestroy(event);
      event = nullptr;
    }
    if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
    stream_ = nullptr;
  }

  int index_;
  std::string name_;
  MemoryLedger ledger_;  // before the members it counts: they go first
  cudaStream_t stream_ = nullptr;
  std::array<cudaEvent_t, kMarkEvents> mark_events_{};
  uint64_t marks_ = 0;
  bool capturing_ = false;
  cublasLtHandle_t lt_handle_ = nullptr;
  DeviceMemory workspace_;
  DeviceMemory scratch_;
  std::unique_ptr<cuda::GemmPlans> plans_;
  std::unique_ptr<cuda::CudnnPlans> cudnn_plans_;
  CudaContext context_;
};

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
