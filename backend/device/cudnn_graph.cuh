// CudnnGraph and CudnnPlans: cuDNN's graph (backend) API in the few shapes the project uses
// (docs/cudnn_attention.md, sections 1-2). A CudnnGraph describes tensors and operations
// (matmul, pointwise, reduction, reshape, random numbers), each finalized as it is added, then the
// operation graph; CudnnPlans, owned by one CUDA device, turns a graph into an execution plan
// (heuristics mode A, then the fallback mode: the first engine configuration that finalizes) once
// per key, remembers a refusal as well as a plan, and executes a plan on the device's stream. No
// engine is filtered by its notes (as cuDNN's frontend does): the attention's determinism comes
// from the graph's form (ops/attention_cudnn_cuda.cu). Every descriptor lives as long as its plan
// (whether cuDNN copies them at finalize is not documented). Only .cu files include this header (it
// names cuDNN's types).
#pragma once

#include <cuda_runtime.h>
#include <cudnn_graph.h>

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "backend/device/device_memory.hpp"

namespace backend::cuda {

// One backend descriptor, destroyed with its owner.
class CudnnDescriptor {
 public:
  explicit CudnnDescriptor(cudnnBackendDescriptorType_t type);
  ~CudnnDescriptor();
  CudnnDescriptor(CudnnDescriptor&& other) noexcept : raw_(other.raw_) { other.raw_ = nullptr; }
  CudnnDescriptor& operator=(CudnnDescriptor&&) = delete;
  CudnnDescriptor(const CudnnDescriptor&) = delete;
  CudnnDescriptor& operator=(const CudnnDescriptor&) = delete;

  cudnnBackendDescriptor_t get() const { return raw_; }
  // Attribute setters; a refused attribute is a common::Error naming it.
  void set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t count,
           const void* values, const char* what);
  void set_descriptor(cudnnBackendAttributeName_t name, cudnnBackendDescriptor_t value,
                      const char* what) {
    set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &value, what);
  }
  // common::Error with cuDNN's reason when the descriptor is refused.
  void finalize(const char* what);

 private:
  cudnnBackendDescriptor_t raw_ = nullptr;
};

// A 4-D tensor of a graph: its descriptor and unique id.
struct CudnnTensor {
  cudnnBackendDescriptor_t descriptor = nullptr;
  int64_t uid = 0;
};

// Where a tensor's values come from: device memory given per execution (io), an intermediate
// the engine keeps to itself (virtual), or a host scalar read when the plan runs (by value).
enum class CudnnTensorKind { io, virtual_tensor, by_value };

// uid: the id an execution's bindings name an io or by-value tensor by (chosen by the caller,
// below kFirstVirtualUid); 0 for a virtual tensor, which takes the graph's next id.
struct CudnnTensorSpec {
  std::array<int64_t, 4> dims{};
  std::array<int64_t, 4> strides{};
  cudnnDataType_t type = CUDNN_DATA_FLOAT;
  CudnnTensorKind kind = CudnnTensorKind::virtual_tensor;
  int64_t uid = 0;
};
inline constexpr int64_t kFirstVirtualUid = 1000;

// One external tensor's memory for an execution: device memory, or the host address of a
// by-value scalar.
struct CudnnBinding {
  int64_t uid;
  void* pointer;
};

// The strides of a packed (row-major) tensor of `dims`.
std::array<int64_t, 4> packed_strides(const std::array<int64_t, 4>& dims);

class CudnnGraph {
 public:
  CudnnTensor tensor(const CudnnTensorSpec& spec, const char* what);
  // A by-value FLOAT scalar ([1,1,1,1]); its binding is a host pointer.
  CudnnTensor scalar(int64_t uid, const char* what);

  // y = mode(x[, b[, t]]) elementwise, computed in `math`; the output's spec is `y`.
  CudnnTensor pointwise(cudnnPointwiseMode_t mode, CudnnTensor x, const CudnnTensorSpec& y,
                        const char* what, cudnnDataType_t math = CUDNN_DATA_FLOAT,
                        CudnnTensor b = {}, CudnnTensor t = {}, int64_t axis = -1);
  // c = a · b over the last two dimensions, batch dimensions broadcast.
  CudnnTensor matmul(CudnnTensor a, CudnnTensor b, const CudnnTensorSpec& c, const char* what);
  // y = reduce(x) over the dimensions where y's is 1 (or a grouped one where it divides x's).
  CudnnTensor reduction(cudnnReduceTensorOp_t op, CudnnTensor x, const CudnnTensorSpec& y,
                        const char* what);
  // y: x's values under another description (a transposed view).
  CudnnTensor reshape(CudnnTensor x, const CudnnTensorSpec& y, const char* what);
  // y: Philox draws, 1 with probability `probability_of_one`, else 0, from the INT64 seed and
  // offset tensors (the same seed, offset and shape give the same y).
  CudnnTensor bernoulli(double probability_of_one, CudnnTensor seed, CudnnTensor offset,
                        const CudnnTensorSpec& y, const char* what);

  // The operation graph of every operation added, in order; common::Error when refused.
  // `handle` (cuDNN before 9.8 requires one here) may be nullptr on later versions, which
  // finalize a graph without a GPU (CI's check of the attention graphs).
  void finalize(int64_t cudnn_version, cudnnHandle_t handle);
  cudnnBackendDescriptor_t operation_graph() const { return graph_.get(); }
  // The io and by-value tensors' ids: an execution binds each once.
  const std::vector<int64_t>& external_uids() const { return external_uids_; }
  size_t operation_count() const { return operations_.size(); }

 private:
  CudnnDescriptor& keep(CudnnDescriptor descriptor);
  CudnnTensor add_operation(CudnnDescriptor operation, CudnnTensor output, const char* what);

  std::vector<std::unique_ptr<CudnnDescriptor>> descriptors_;  // tensors and op settings
  std::vector<cudnnBackendDescriptor_t> operations_;
  std::vector<int64_t> external_uids_;
  int64_t next_uid_ = kFirstVirtualUid;
  CudnnDescriptor graph_{CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR};
};

// A graph made runnable: the plan and the workspace it needs.
struct CudnnPlan {
  std::unique_ptr<CudnnGraph> graph;
  std::unique_ptr<CudnnDescriptor> engine_config;
  std::unique_ptr<CudnnDescriptor> plan;
  int64_t workspace_bytes = 0;
};

// One CUDA device's cuDNN handle, plans and workspace. Made by the device when its attention
// backend may use cuDNN; common::Error when cuDNN cannot be loaded or initialised.
//
// The workspace: a plan's size is known only once cuDNN has built it, so the workspace grows
// (through `allocate`, the device's allocate_zeroed, counted in its memory) when a plan that
// needs more is built: the first call of each shape, the first micro batch of a run. Later
// calls allocate nothing.
class CudnnPlans {
 public:
  using Allocate = std::function<DeviceMemory(int64_t bytes, std::string_view what)>;
  CudnnPlans(int device_index, cudaStream_t stream, Allocate allocate);
  ~CudnnPlans();
  CudnnPlans(const CudnnPlans&) = delete;
  CudnnPlans& operator=(const CudnnPlans&) = delete;

  int64_t version() const { return version_; }
  cudnnHandle_t handle() const { return handle_; }
  int compute_capability() const { return compute_capability_; }

  struct Lookup {
    const CudnnPlan* plan = nullptr;  // nullptr: refused
    std::string refusal;              // why, when refused
    bool first_time = false;          // built or refused by this call
  };
  // The plan for `key`, described by `describe` and built the first time the key is seen; a
  // graph, heuristic or plan that cuDNN refuses makes a refusal (remembered for the key); so
  // does a common::Error thrown by `describe` (a known gate). Once built, the workspace holds
  // at least the plan's own (first, 256-byte aligned) and then `caller_bytes` for the caller.
  Lookup plan(const std::vector<int64_t>& key, const std::function<CudnnGraph()>& describe,
              int64_t caller_bytes);
  // The workspace: the plan's part, then the caller's from caller_offset(plan).
  void* workspace() const { return workspace_.data(); }
  static int64_t caller_offset(const CudnnPlan& plan);

  // Runs `plan` on the device's stream with every external tensor bound once (common::Error
  // for a binding missing, and for a failed execution).
  void execute(const CudnnPlan& plan, std::span<const CudnnBinding> bindings);

 private:
  CudnnPlan build(CudnnGraph graph);

  cudnnHandle_t handle_ = nullptr;
  Allocate allocate_;
  DeviceMemory workspace_;
  int64_t version_ = 0;
  int compute_capability_ = 0;
  struct Entry {
    std::unique_ptr<CudnnPlan> plan;
    std::string refusal;
  };
  std::map<std::vector<int64_t>, Entry> entries_;
};

}  // namespace backend::cuda
