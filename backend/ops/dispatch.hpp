// How an op of backend/ops/ reaches its twin, for the op families' <family>.cpp files only: the
// op tells the device's observer it starts, checks its views once (memory of the device's
// kind, the element type its twin takes) and calls the CPU twin (backend::cpu, host memory,
// fp32 or fp64) or the CUDA twin (backend::cuda, GPU memory, fp32, bf16 or fp16, on the
// device's stream), then tells the observer it is queued. The error messages name the device
// kind, the op and the views' extents.
//
// A build without CUDA has no CUDA twins: BACKEND_BUILT_WITH_CUDA (set by backend/CMakeLists.txt)
// is 0 there, and an op's GPU branch is discarded by `if constexpr`, so nothing names a twin
// that is not built. No CUDA device can be made in such a build (make_cuda_device refuses).
#pragma once

#include <cstdint>
#include <functional>
#include <string_view>

#include "backend/common/error.hpp"
#include "backend/core/view.hpp"
#include "backend/device/device.hpp"
#include "backend/ops/norm_kind.hpp"

namespace backend::ops::detail {

inline constexpr bool kBuiltWithCuda = BACKEND_BUILT_WITH_CUDA;

// ---- the CPU twins' side ------------------------------------------------------------------

// Calls function(Scalar{}) with Scalar the C++ type of `dtype`: the CPU twins compute in fp32
// or fp64 and refuse bf16 and fp16 by name rather than compute them in another precision.
template <typename Function>
void host_scalar(ElementType dtype, std::string_view op, Function&& function) {
  switch (dtype) {
    case ElementType::f32: function(float{}); return;
    case ElementType::f64: function(double{}); return;
    default:
      common::fail("the CPU device computes in fp32 or fp64; {} has no {} kernel on it (bf16 and "
                   "fp16 run on --device cuda)",
                   op, element_name(dtype));
  }
}

// The view's elements as S*: host memory of type S (or empty: nullptr).
template <typename S>
S* host(View view) {
  host_bytes(view);
  return view.as<S>();
}

inline const int32_t* host_ids(View view) { return host<int32_t>(view); }

// An op's scalars in the device's memory: `count` f64 elements, else common::Error naming the
// op and the view.
inline void check_scalars(const View& view, int64_t count, const char* name, const char* op) {
  if (view.type != ElementType::f64 || view.numel != count) {
    common::fail("{}: {} must be {} f64 of the device, got {} {}", op, name, count, view.numel,
                 element_name(view.type));
  }
}

// ---- the CUDA twins' side -----------------------------------------------------------------

// Calls function(Scalar{}) with Scalar the host type of `dtype` (float, bfloat16 or float16):
// the types the CUDA twins compute in. fp64 is refused by name.
template <typename Function>
void gpu_scalar(ElementType dtype, std::string_view op, Function&& function) {
  switch (dtype) {
    case ElementType::f32: function(float{}); return;
    case ElementType::bf16: function(bfloat16{}); return;
    case ElementType::f16: function(float16{}); return;
    default:
      common::fail("the CUDA device computes in fp32, bf16 or fp16; {} has no {} kernel on it",
                   op, element_name(dtype));
  }
}

// The view's elements as S*: GPU memory of type S (or empty: nullptr).
template <typename S>
S* gpu(View view, std::string_view op) {
  check_on_gpu(view, op);
  if (!view.empty() && view.type != element_type_of<S>()) {
    common::fail("{}: a view of {} where {} was expected ({} elements)", op,
                 element_name(view.type), element_name(element_type_of<S>()), view.numel);
  }
  return static_cast<S*>(view.data);
}

inline const int32_t* gpu_ids(View view, std::string_view op) { return gpu<int32_t>(view, op); }

// ---- the norms' residual connection (norm_kind.hpp) ------------------------------------

// The residual and branch views have the sum's (the op's input's) extent and are other memory.
inline void check_residual_views(const View& sum, const ResidualViews& residual,
                                 std::string_view op) {
  if (!residual.active()) return;
  check_same_extent(sum, residual.residual, op);
  check_same_extent(sum, residual.branch, op);
  if (sum.data == residual.residual.data || sum.data == residual.branch.data) {
    common::fail("{}: the residual connection's sum must be other memory than its operands", op);
  }
}

template <typename S>
ResidualAdd<S> host_residual(View sum, const ResidualViews& residual) {
  if (!residual.active()) return {};
  return {host<S>(sum), host<S>(residual.residual), host<S>(residual.branch)};
}

template <typename S>
ResidualAdd<S> gpu_residual(View sum, const ResidualViews& residual, std::string_view op) {
  if (!residual.active()) return {};
  return {gpu<S>(sum, op), gpu<S>(residual.residual, op), gpu<S>(residual.branch, op)};
}

// ---- one op's frame -----------------------------------------------------------------------

// Runs on_host() on a host device, on_gpu(cuda_context) on a CUDA one, between the observer's
// two calls. on_gpu must be a generic lambda (`[&](const auto& cuda)`) so that a build without
// CUDA never instantiates it.
// While a host device captures (Device::host_recording) on_host is copied into the recording
// instead of run, and runs at each replay, after the op has returned: so on_host captures the
// op's arguments by value (`[=]`, with `&device` where it asks the device for scratch), which
// is also what a CUDA graph keeps of a kernel's arguments. (A CUDA twin under a stream capture
// is called as always; the stream records its launches.)
template <typename OnHost, typename OnGpu>
void run(Device& device, std::string_view op, double flops, OnHost&& on_host, OnGpu&& on_gpu) {
  OpObserver* observer = device.observer();
  if (observer != nullptr) observer->op_started(op);
  if (device.memory_kind() == MemoryKind::host) {
    if (HostOpRecording* recording = device.host_recording()) {
      recording->add(std::function<void()>(on_host));
    } else {
      on_host();
    }
  } else {
    [[maybe_unused]] const CudaContext& cuda = device.cuda_context();
    if constexpr (kBuiltWithCuda) on_gpu(cuda);
  }
  if (observer != nullptr) observer->op_queued(op, flops);
}

// The common case: one element type picks the twin's Scalar. on_host(Scalar{}) (capturing by
// value, as run's) with fp32 or fp64 on a host device, on_gpu(Scalar{}, cuda_context) with fp32,
// bf16 or fp16 on a CUDA one; any other type is refused naming the op (host_scalar, gpu_scalar).
template <typename OnHost, typename OnGpu>
void run_typed(Device& device, std::string_view op, double flops, ElementType dtype,
               OnHost&& on_host, OnGpu&& on_gpu) {
  run(
      device, op, flops, [dtype, op, on_host] { host_scalar(dtype, op, on_host); },
      [&](const auto& context) {
        gpu_scalar(dtype, op, [&](auto scalar) { on_gpu(scalar, context); });
      });
}

}  // namespace backend::ops::detail
