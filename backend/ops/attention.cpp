// attention.hpp's op over Views: the views checked once, then the CPU or the CUDA twin
// (ops/dispatch.hpp).
#include "backend/ops/attention.hpp"

#include <omp.h>

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

// Whether attention of this qkv runs on tensor cores (CudaDeviceOptions::flash_attention):
// bf16 or fp16 with a head dimension the kernel has; every other case takes the CUDA-core
// kernel. (Unused in a build without CUDA, whose GPU branches are discarded.)
[[maybe_unused]] bool runs_flash_attention(const CudaContext& context, const View& qkv,
                                           const AttentionShape& shape) {
  const bool sixteen_bit = qkv.type == ElementType::bf16 || qkv.type == ElementType::f16;
  return context.flash_attention && sixteen_bit && shape.num_heads > 0 &&
         shape.hidden_size % shape.num_heads == 0 &&
         cuda::flash_attention_supports(shape.head_dim());
}

}  // namespace

void attention_forward(Device& device, View output, View logsumexp, View qkv,
                       const AttentionShape& shape, const Dropout& dropout) {
  constexpr const char* op = "attention_forward";
  run(
      device, op, causal_attention_flops(shape),
      [&] {
        host_scalar(qkv.type, op, [&](auto s) {
          using S = decltype(s);
          cpu::attention_forward(host<S>(output), host<S>(logsumexp), host<S>(qkv), shape, dropout,
                                 {}, attention_scratch<S>(device, shape, op));
        });
      },
      [&](const auto& context) {
        check_attention_dropout(dropout, op);
        const bool flash = runs_flash_attention(context, qkv, shape);
        gpu_scalar(qkv.type, op, [&](auto s) {
          using S = decltype(s);
          if constexpr (!std::is_same_v<S, float>) {
            if (flash) {
              cuda::flash_attention_forward(gpu<S>(output, op), gpu<float>(logsumexp, op),
                                            gpu<S>(qkv, op), shape, dropout, context.stream);
              return;
            }
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
      [&] {
        host_scalar(qkv.type, op, [&](auto s) {
          using S = decltype(s);
          cpu::attention_backward(host<S>(dqkv), host<S>(doutput), host<S>(qkv), host<S>(output),
                                  host<S>(logsumexp), shape, dropout, {},
                                  attention_scratch<S>(device, shape, op));
        });
      },
      [&](const auto& context) {
        check_attention_dropout(dropout, op);
        const bool flash = runs_flash_attention(context, qkv, shape);
        gpu_scalar(qkv.type, op, [&](auto s) {
          using S = decltype(s);
          if constexpr (!std::is_same_v<S, float>) {
            if (flash) {
              cuda::flash_attention_backward(gpu<S>(dqkv, op), gpu<S>(doutput, op), gpu<S>(qkv, op),
                                             gpu<S>(output, op), gpu<float>(logsumexp, op), shape,
                                             dropout, context.stream);
              return;
            }
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
      [&](auto s) {
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
