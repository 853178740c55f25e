// attention.hpp's op over Views: the views checked once, then the CPU or the CUDA twin
// (ops/dispatch.hpp).
#include "backend/ops/attention.hpp"

#include <omp.h>
#include <spdlog/spdlog.h>

#include <type_traits>

#include "backend/ops/dispatch.hpp"

namespace backend::ops {

using namespace detail;

namespace {

double causal_attention_flops(const AttentionShape& shape) {
  // Q·Kᵀ and P·V over the lower triangle: 2 products × 2 FLOPs × B·T²·hidden / 2.
  return 2.0 * static_cast<double>(shape.batch_size) * static_cast<double>(shape.seq_length) *
         static_cast<double>(shape.seq_length) * static_cast<double>(shape.hidden_size);
}

// The CPU twins' per-thread blocks (attention_scratch_per_thread × the OpenMP threads) from
// the device's scratch, which keeps them between calls: a training step's shape is the first
// step's, so later steps allocate nothing. nullptr where the twin refuses the shape or has
// nothing to do.
template <typename Scalar>
Scalar* attention_scratch(Device& device, const AttentionShape& shape, const char* op) {
  if (shape.seq_length <= 0 || shape.num_query_groups <= 0 ||
      shape.num_heads % shape.num_query_groups != 0) {
    return nullptr;
  }
  const int64_t scalars =
      static_cast<int64_t>(omp_get_max_threads()) *
      cpu::attention_scratch_per_thread(shape.seq_length, shape.heads_per_group());
  return static_cast<Scalar*>(device.scratch(scalars * int64_t{sizeof(Scalar)}, op));
}

// Whether 16-bit attention of this shape runs on our tensor-core kernels: under flash, or under
// auto where cuDNN did not run it, with a head dimension the kernel has; every other case takes
// the CUDA-core kernel. (Unused in a build without CUDA, whose GPU branches are discarded.)
[[maybe_unused]] bool runs_flash_attention(const CudaContext& context,
                                           const AttentionShape& shape) {
  const bool backend = context.attention_backend == AttentionBackend::flash ||
                       context.attention_backend == AttentionBackend::automatic;
  return backend && cuda::flash_attention_supports(shape.head_dim());
}

// Whether cuDNN ran the call, with one log line when it first built a shape's plan. A call it
// did not run leaves: under fused an error naming the reason; under auto one log line the
// first time this device refused the shape, then our kernels run.
[[maybe_unused]] bool report_cudnn_outcome(const CudaContext& context,
                                           const cuda::CudnnAttentionOutcome& outcome,
                                           const AttentionShape& shape, const char* op) {
  const auto describe = [&] {
    return fmt::format("B={} T={} hidden={} heads={} groups={}", shape.batch_size, shape.seq_length,
                       shape.hidden_size, shape.num_heads, shape.num_query_groups);
  };
  if (outcome.ran) {
    if (outcome.built_plan) {
      spdlog::info("{}: cuDNN's fused attention runs {} (workspace {} bytes)", op, describe(),
                   outcome.workspace_bytes);
    }
    return true;
  }
  if (context.attention_backend == AttentionBackend::fused) {
    common::fail(
        "{} with --attention-backend fused: cuDNN does not run this call ({}): {}; "
        "--attention-backend auto falls back to our kernels",
        op, describe(), outcome.refusal);
  }
  if (outcome.first_refusal) {
    spdlog::warn("{}: cuDNN's fused attention does not run {} ({}); our {} kernel runs it", op,
                 describe(), outcome.refusal,
                 cuda::flash_attention_supports(shape.head_dim()) ? "tensor-core" : "CUDA-core");
  }
  return false;
}

// A 32-bit call under fused: cuDNN's fused attention is 16-bit only.
[[maybe_unused]] void refuse_fp32_under_fused(const CudaContext& context, const char* op) {
  if (context.attention_backend == AttentionBackend::fused) {
    common::fail(
        "{} with --attention-backend fused: cuDNN's fused attention computes bf16 or "
        "fp16 (--bf16, --fp16), not fp32; --attention-backend auto or local runs fp32 "
        "on the CUDA-core kernel",
        op);
  }
}

}  // namespace

void attention_forward(Device& device, View output, View logsumexp, View qkv,
                       const AttentionShape& shape, const Dropout& dropout) {
  constexpr const char* op = "attention_forward";
  run(
      device, op, causal_attention_flops(shape),
      [=, &device] {
        host_scalar(qkv.type, op, [&](auto s) {
          using S = decltype(s);
          cpu::attention_forward(host<S>(output), host<S>(logsumexp), host<S>(qkv), shape, dropout,
                                 {}, attention_scratch<S>(device, shape, op));
        });
      },
      [&](const auto& context) {
        check_attention_dropout(dropout, op);
        check_attention_shape(shape, op);
        gpu_scalar(qkv.type, op, [&](auto s) {
          using S = decltype(s);
          if constexpr (!std::is_same_v<S, float>) {
            if (uses_cudnn(context.attention_backend)) {
              const auto outcome = cuda::cudnn_attention_forward(context, gpu<S>(output, op),
                                                                 gpu<float>(logsumexp, op),
                                                                 gpu<S>(qkv, op), shape, dropout);
              if (report_cudnn_outcome(context, outcome, shape, op)) return;
            }
            if (runs_flash_attention(context, shape)) {
              cuda::flash_attention_forward(gpu<S>(output, op), gpu<float>(logsumexp, op),
                                            gpu<S>(qkv, op), shape, dropout, context.stream);
              return;
            }
          } else {
            refuse_fp32_under_fused(context, op);
          }
          cuda::attention_forward(gpu<S>(output, op), gpu<float>(logsumexp, op), gpu<S>(qkv, op),
                                  shape, dropout, context.stream);
        });
      });
}

void attention_backward(Device& device, View dqkv, View doutput, View qkv, View output,
                        View logsumexp, const AttentionShape& shape, const Dropout& dropout) {
  constexpr const char* op = "attention_backward";
  run(
      device, op, 2.5 * causal_attention_flops(shape),
      [=, &device] {
        host_scalar(qkv.type, op, [&](auto s) {
          using S = decltype(s);
          cpu::attention_backward(host<S>(dqkv), host<S>(doutput), host<S>(qkv), host<S>(output),
                                  host<S>(logsumexp), shape, dropout, {},
                                  attention_scratch<S>(device, shape, op));
        });
      },
      [&](const auto& context) {
        check_attention_dropout(dropout, op);
        check_attention_shape(shape, op);
        gpu_scalar(qkv.type, op, [&](auto s) {
          using S = decltype(s);
          if constexpr (!std::is_same_v<S, float>) {
            if (uses_cudnn(context.attention_backend)) {
              const auto outcome = cuda::cudnn_attention_backward(
                  context, gpu<S>(dqkv, op), gpu<S>(doutput, op), gpu<S>(qkv, op),
                  gpu<S>(output, op), gpu<float>(logsumexp, op), shape, dropout);
              if (report_cudnn_outcome(context, outcome, shape, op)) return;
            }
            if (runs_flash_attention(context, shape)) {
              cuda::flash_attention_backward(gpu<S>(dqkv, op), gpu<S>(doutput, op), gpu<S>(qkv, op),
                                             gpu<S>(output, op), gpu<float>(logsumexp, op), shape,
                                             dropout, context.stream);
              return;
            }
          } else {
            refuse_fp32_under_fused(context, op);
          }
          cuda::attention_backward(gpu<S>(dqkv, op), gpu<S>(doutput, op), gpu<S>(qkv, op),
                                   gpu<S>(output, op), gpu<float>(logsumexp, op), shape, dropout,
                                   context.stream);
        });
      });
}

void kv_cache_attention_forward(Device& device, View output, View key_cache, View value_cache,
                                View qkv, View slots, View positions, int64_t rows,
                                int64_t num_heads, int64_t num_query_groups, int64_t head_dim,
                                int64_t max_length) {
  constexpr const char* op = "kv_cache_attention_forward";
  run_typed(
      device, op, 0, qkv.type,
      [=](auto s) {
        using S = decltype(s);
        cpu::kv_cache_attention_forward(host<S>(output), host<S>(key_cache),
                                        host<S>(value_cache), host<S>(qkv), host_ids(slots),
                                        host_ids(positions), rows, num_heads, num_query_groups,
                                        head_dim, max_length);
      },
      [&](auto s, const auto& context) {
        using S = decltype(s);
        cuda::kv_cache_attention_forward(gpu<S>(output, op), gpu<S>(key_cache, op),
                                         gpu<S>(value_cache, op), gpu<S>(qkv, op),
                                         gpu_ids(slots, op), gpu_ids(positions, op), rows,
                                         num_heads, num_query_groups, head_dim, max_length,
                                         context.stream);
      });
}

}  // namespace backend::ops
