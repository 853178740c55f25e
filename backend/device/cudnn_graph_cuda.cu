// cudnn_graph.cuh: descriptors set and finalized one attribute at a time (cuDNN's graph API,
// cudnn_graph.h), the plan chosen as PyTorch's and llm.c's cuDNN attention choose theirs
// (heuristics mode A, then the fallback list, the first configuration that finalizes;
// docs/cudnn_attention.md, section 2).
#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "backend/common/error.hpp"
#include "backend/core/cuda_check.cuh"
#include "backend/device/cudnn_graph.cuh"
#include "backend/device/cudnn_library.cuh"

namespace backend::cuda {
namespace {

using cuda_detail::cudnn;
using cuda_detail::cudnn_status_text;

// Attributes cuDNN 9.19 marks deprecated and older 9.x require (the operation graph's and the
// plan's handle): by number, so the build stays free of deprecation warnings.
constexpr auto kOperationGraphHandle = static_cast<cudnnBackendAttributeName_t>(800);
constexpr auto kExecutionPlanHandle = static_cast<cudnnBackendAttributeName_t>(400);

void check(cudnnStatus_t status, const char* action, const char* what) {
  if (status != CUDNN_STATUS_SUCCESS) {
    common::fail("cuDNN refused {} of {}: {}", action, what, cudnn_status_text(status));
  }
}

}  // namespace

// ---- descriptors ---------------------------------------------------------------------------

CudnnDescriptor::CudnnDescriptor(cudnnBackendDescriptorType_t type) {
  check(cudnn().create_descriptor(type, &raw_), "creating a descriptor", "the graph");
}

CudnnDescriptor::~CudnnDescriptor() {
  if (raw_ != nullptr) (void)cudnn().destroy_descriptor(raw_);
}

void CudnnDescriptor::set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
                          int64_t count, const void* values, const char* what) {
  const cudnnStatus_t status = cudnn().set_attribute(raw_, name, type, count, values);
  if (status != CUDNN_STATUS_SUCCESS) {
    common::fail("cuDNN refused attribute {} of {}: {}", static_cast<int>(name), what,
                 cudnn_status_text(status));
  }
}

void CudnnDescriptor::finalize(const char* what) {
  check(cudnn().finalize(raw_), "finalizing", what);
}

std::array<int64_t, 4> packed_strides(const std::array<int64_t, 4>& dims) {
  return {dims[1] * dims[2] * dims[3], dims[2] * dims[3], dims[3], 1};
}

// ---- the graph ----------------------------------------------------------------------------

CudnnDescriptor& CudnnGraph::keep(CudnnDescriptor descriptor) {
  descriptors_.push_back(std::make_unique<CudnnDescriptor>(std::move(descriptor)));
  return *descriptors_.back();
}

CudnnTensor CudnnGraph::tensor(const CudnnTensorSpec& spec, const char* what) {
  const bool external = spec.kind != CudnnTensorKind::virtual_tensor;
  if (external != (spec.uid != 0) || (external && spec.uid >= kFirstVirtualUid)) {
    common::fail(
        "cuDNN graph: {} needs a caller's id below {} exactly when it is not virtual "
        "(got {})",
        what, kFirstVirtualUid, spec.uid);
  }
  CudnnDescriptor& d = keep(CudnnDescriptor(CUDNN_BACKEND_TENSOR_DESCRIPTOR));
  const int64_t uid = external ? spec.uid : next_uid_++;
  // Tensor-core engines need 16-byte aligned operands; the callers' pointers are.
  const int64_t alignment = 16;
  d.set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &spec.type, what);
  d.set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, spec.dims.data(), what);
  d.set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, spec.strides.data(), what);
  d.set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, what);
  d.set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment, what);
  const bool yes = true;
  if (spec.kind == CudnnTensorKind::virtual_tensor) {
    d.set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &yes, what);
  } else {
    if (spec.kind == CudnnTensorKind::by_value) {
      d.set(CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &yes, what);
    }
    external_uids_.push_back(uid);
  }
  d.finalize(what);
  return {d.get(), uid};
}

CudnnTensor CudnnGraph::scalar(int64_t uid, const char* what) {
  return tensor({.dims = {1, 1, 1, 1},
                 .strides = {1, 1, 1, 1},
                 .type = CUDNN_DATA_FLOAT,
                 .kind = CudnnTensorKind::by_value,
                 .uid = uid},
                what);
}

CudnnTensor CudnnGraph::add_operation(CudnnDescriptor operation, CudnnTensor output,
                                      const char* what) {
  operation.finalize(what);
  operations_.push_back(keep(std::move(operation)).get());
  return output;
}

CudnnTensor CudnnGraph::pointwise(cudnnPointwiseMode_t mode, CudnnTensor x,
                                  const CudnnTensorSpec& y_spec, const char* what,
                                  cudnnDataType_t math, CudnnTensor b, CudnnTensor t,
                                  int64_t axis) {
  CudnnDescriptor& settings = keep(CudnnDescriptor(CUDNN_BACKEND_POINTWISE_DESCRIPTOR));
  settings.set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, what);
  settings.set(CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &math, what);
  if (axis >= 0) settings.set(CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis, what);
  settings.finalize(what);
  const CudnnTensor y = tensor(y_spec, what);
  CudnnDescriptor operation(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
  operation.set_descriptor(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, settings.get(), what);
  operation.set_descriptor(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x.descriptor, what);
  if (b.descriptor != nullptr) {
    operation.set_descriptor(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b.descriptor, what);
  }
  if (t.descriptor != nullptr) {
    operation.set_descriptor(CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t.descriptor, what);
  }
  operation.set_descriptor(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y.descriptor, what);
  const float one = 1.0f;  // as cuDNN's frontend always sets them
  operation.set(CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &one, what);
  if (b.descriptor != nullptr) {
    operation.set(CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &one, what);
  }
  return add_operation(std::move(operation), y, what);
}

CudnnTensor CudnnGraph::matmul(CudnnTensor a, CudnnTensor b, const CudnnTensorSpec& c_spec,
                               const char* what) {
  CudnnDescriptor& settings = keep(CudnnDescriptor(CUDNN_BACKEND_MATMUL_DESCRIPTOR));
  const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
  settings.set(CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute, what);
  settings.finalize(what);
  const CudnnTensor c = tensor(c_spec, what);
  CudnnDescriptor operation(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
  operation.set_descriptor(CUDNN_ATTR_OPERATION_MATMUL_ADESC, a.descriptor, what);
  operation.set_descriptor(CUDNN_ATTR_OPERATION_MATMUL_BDESC, b.descriptor, what);
  operation.set_descriptor(CUDNN_ATTR_OPERATION_MATMUL_CDESC, c.descriptor, what);
  operation.set_descriptor(CUDNN_ATTR_OPERATION_MATMUL_DESC, settings.get(), what);
  return add_operation(std::move(operation), c, what);
}

CudnnTensor CudnnGraph::reduction(cudnnReduceTensorOp_t op, CudnnTensor x,
                                  const CudnnTensorSpec& y_spec, const char* what) {
  CudnnDescriptor& settings = keep(CudnnDescriptor(CUDNN_BACKEND_REDUCTION_DESCRIPTOR));
  const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
  settings.set(CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &op, what);
  settings.set(CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute, what);
  settings.finalize(what);
  const CudnnTensor y = tensor(y_spec, what);
  CudnnDescriptor operation(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
  operation.set_descriptor(CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x.descriptor, what);
  operation.set_descriptor(CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y.descriptor, what);
  operation.set_descriptor(CUDNN_ATTR_OPERATION_REDUCTION_DESC, settings.get(), what);
  return add_operation(std::move(operation), y, what);
}

CudnnTensor CudnnGraph::reshape(CudnnTensor x, const CudnnTensorSpec& y_spec, const char* what) {
  const CudnnTensor y = tensor(y_spec, what);
  CudnnDescriptor operation(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
  operation.set_descriptor(CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x.descriptor, what);
  operation.set_descriptor(CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y.descriptor, what);
  return add_operation(std::move(operation), y, what);
}

CudnnTensor CudnnGraph::bernoulli(double probability_of_one, CudnnTensor seed, CudnnTensor offset,
                                  const CudnnTensorSpec& y_spec, const char* what) {
  CudnnDescriptor& settings = keep(CudnnDescriptor(CUDNN_BACKEND_RNG_DESCRIPTOR));
  const cudnnRngDistribution_t distribution = CUDNN_RNG_DISTRIBUTION_BERNOULLI;
  settings.set(CUDNN_ATTR_RNG_DISTRIBUTION, CUDNN_TYPE_RNG_DISTRIBUTION, 1, &distribution, what);
  settings.set(CUDNN_ATTR_RNG_BERNOULLI_DIST_PROBABILITY, CUDNN_TYPE_DOUBLE, 1, &probability_of_one,
               what);
  settings.finalize(what);
  const CudnnTensor y = tensor(y_spec, what);
  CudnnDescriptor operation(CUDNN_BACKEND_OPERATION_RNG_DESCRIPTOR);
  operation.set_descriptor(CUDNN_ATTR_OPERATION_RNG_YDESC, y.descriptor, what);
  operation.set_descriptor(CUDNN_ATTR_OPERATION_RNG_DESC, settings.get(), what);
  operation.set_descriptor(CUDNN_ATTR_OPERATION_RNG_SEED, seed.descriptor, what);
  operation.set_descriptor(CUDNN_ATTR_OPERATION_RNG_OFFSET_DESC, offset.descriptor, what);
  return add_operation(std::move(operation), y, what);
}

void CudnnGraph::finalize(int64_t cudnn_version, cudnnHandle_t handle) {
  graph_.set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
             static_cast<int64_t>(operations_.size()), operations_.data(), "the operation graph");
  // cuDNN before 9.8 requires the handle here; later ones take it from the plan.
  if (cudnn_version < 90800 && handle != nullptr) {
    graph_.set(kOperationGraphHandle, CUDNN_TYPE_HANDLE, 1, &handle, "the operation graph");
  }
  graph_.finalize("the operation graph");
}

// ---- plans --------------------------------------------------------------------------------

CudnnPlans::CudnnPlans(int device_index, cudaStream_t stream, Allocate allocate)
    : allocate_(std::move(allocate)) {
  const cuda_detail::CudnnLibrary& library = cudnn();
  version_ = static_cast<int64_t>(library.get_version());
  int major = 0, minor = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device_index));
  CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device_index));
  compute_capability_ = major * 10 + minor;
  CUDNN_CHECK(library.create(&handle_));
  const cudnnStatus_t status = library.set_stream(handle_, stream);
  if (status != CUDNN_STATUS_SUCCESS) {
    (void)library.destroy(handle_);
    CUDNN_CHECK(status);
  }
}

CudnnPlans::~CudnnPlans() {
  entries_.clear();  // plans before the handle they were made with
  workspace_ = {};
  if (handle_ != nullptr) (void)cudnn().destroy(handle_);
}

namespace {
constexpr int64_t kWorkspaceAlignment = 256;
}  // namespace

int64_t CudnnPlans::caller_offset(const CudnnPlan& plan) {
  return (plan.workspace_bytes + kWorkspaceAlignment - 1) / kWorkspaceAlignment *
         kWorkspaceAlignment;
}

CudnnPlans::Lookup CudnnPlans::plan(const std::vector<int64_t>& key,
                                    const std::function<CudnnGraph()>& describe,
                                    int64_t caller_bytes) {
  auto found = entries_.find(key);
  const bool first_time = found == entries_.end();
  if (first_time) {
    Entry entry;
    try {
      entry.plan = std::make_unique<CudnnPlan>(build(describe()));
    } catch (const common::Error& error) {
      entry.refusal = error.what();
    }
    if (entry.plan != nullptr) {
      const int64_t needed = caller_offset(*entry.plan) + caller_bytes;
      if (needed > workspace_.bytes()) {
        workspace_ = {};  // cudaFree waits for the device: nothing queued still uses it
        workspace_ = allocate_(needed, "cuDNN's attention workspace");
      }
    }
    found = entries_.emplace(key, std::move(entry)).first;
  }
  return {found->second.plan.get(), found->second.refusal, first_time};
}

CudnnPlan CudnnPlans::build(CudnnGraph graph) {
  const cuda_detail::CudnnLibrary& library = cudnn();
  CudnnPlan result;
  result.graph = std::make_unique<CudnnGraph>(std::move(graph));
  std::string refusals;  // each configuration tried and why it did not build
  for (const cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    CudnnDescriptor heuristics(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    heuristics.set_descriptor(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH,
                              result.graph->operation_graph(), "the heuristics");
    heuristics.set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode, "the heuristics");
    if (const cudnnStatus_t status = library.finalize(heuristics.get());
        status != CUDNN_STATUS_SUCCESS) {
      refusals += fmt::format("\n  heuristics mode {}: {}", static_cast<int>(mode),
                              cudnn_status_text(status));
      continue;
    }
    int64_t count = 0;
    CUDNN_CHECK(library.get_attribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                      CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr));
    std::vector<std::unique_ptr<CudnnDescriptor>> configs;
    std::vector<cudnnBackendDescriptor_t> raw;
    for (int64_t i = 0; i < count; ++i) {
      configs.push_back(std::make_unique<CudnnDescriptor>(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR));
      raw.push_back(configs.back()->get());
    }
    int64_t returned = 0;
    if (count > 0) {
      CUDNN_CHECK(library.get_attribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                        CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &returned,
                                        raw.data()));
    }
    for (int64_t i = 0; i < std::min(count, returned); ++i) {
      auto plan = std::make_unique<CudnnDescriptor>(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
      // Deprecated in 9.19 and required before: a version that has dropped it says so when the
      // plan is finalized without it, which the refusal then names.
      (void)library.set_attribute(plan->get(), kExecutionPlanHandle, CUDNN_TYPE_HANDLE, 1,
                                  &handle_);
      plan->set_descriptor(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, raw[i], "the execution plan");
      const cudnnStatus_t status = library.finalize(plan->get());
      if (status != CUDNN_STATUS_SUCCESS) {
        refusals += fmt::format("\n  configuration {}: {}", i, cudnn_status_text(status));
        continue;
      }
      int64_t values = 0;
      CUDNN_CHECK(library.get_attribute(plan->get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                        CUDNN_TYPE_INT64, 1, &values, &result.workspace_bytes));
      result.engine_config = std::move(configs[i]);
      result.plan = std::move(plan);
      return result;
    }
  }
  common::fail("cuDNN {} built no execution plan on sm{} for the graph ({} operations):{}",
               version_, compute_capability_, result.graph->operation_count(),
               refusals.empty() ? std::string("\n  no engine configuration offered") : refusals);
}

void CudnnPlans::execute(const CudnnPlan& plan, std::span<const CudnnBinding> bindings) {
  void* workspace = workspace_.data();
  const std::vector<int64_t>& uids = plan.graph->external_uids();
  std::vector<int64_t> bound_uids;
  std::vector<void*> pointers;
  for (const CudnnBinding& binding : bindings) {
    bound_uids.push_back(binding.uid);
    pointers.push_back(binding.pointer);
  }
  if (!std::is_permutation(uids.begin(), uids.end(), bound_uids.begin(), bound_uids.end())) {
    common::fail("cuDNN plan: {} bindings for its {} external tensors do not name each once",
                 bound_uids.size(), uids.size());
  }
  CudnnDescriptor pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64,
           static_cast<int64_t>(bound_uids.size()), bound_uids.data(), "the variant pack");
  pack.set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR,
           static_cast<int64_t>(pointers.size()), pointers.data(), "the variant pack");
  pack.set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace,
           "the variant pack");
  pack.finalize("the variant pack");
  CUDNN_CHECK(cudnn().execute(handle_, plan.plan->get(), pack.get()));
}

}  // namespace backend::cuda
