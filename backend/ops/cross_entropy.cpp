// cross_entropy.hpp's op over Views: the views checked once, then the CPU or the CUDA twin
// (ops/dispatch.hpp).
#include "backend/ops/cross_entropy.hpp"

#include "backend/ops/dispatch.hpp"

namespace backend::ops {

using namespace detail;

void cross_entropy_forward(Device& device, View losses, View logsumexp, View logits,
                           View labels, int64_t rows, int64_t vocab_size) {
  constexpr const char* op = "cross_entropy_forward";
  run_typed(
      device, op, 0, logits.type,
      [=](auto s) {
        using S = decltype(s);
        cpu::cross_entropy_forward(host<S>(losses), host<S>(logsumexp), host<S>(logits),
                                   host_ids(labels), rows, vocab_size);
      },
      [&](auto s, const auto& context) {
        using S = decltype(s);
        cuda::cross_entropy_forward(gpu<float>(losses, op), gpu<float>(logsumexp, op),
                                    gpu<S>(logits, op), gpu_ids(labels, op), rows, vocab_size,
                                    context.stream);
      });
}

void cross_entropy_backward(Device& device, View dlogits, View logits, View logsumexp, View labels,
                            double scale, int64_t rows, int64_t vocab_size, int64_t vocab_start,
                            View stored_scale) {
  constexpr const char* op = "cross_entropy_backward";
  if (!stored_scale.empty()) check_scalars(stored_scale, 1, "the stored scale", op);
  run_typed(
      device, op, 0, logits.type,
      [=](auto s) {
        using S = decltype(s);
        const double in_force = stored_scale.empty() ? scale : *host<double>(stored_scale);
        cpu::cross_entropy_backward(host<S>(dlogits), host<S>(logits), host<S>(logsumexp),
                                    host_ids(labels), static_cast<S>(in_force), rows, vocab_size,
                                    vocab_start);
      },
      [&](auto s, const auto& context) {
        using S = decltype(s);
        cuda::cross_entropy_backward(gpu<S>(dlogits, op), gpu<S>(logits, op),
                                     gpu<float>(logsumexp, op), gpu_ids(labels, op),
                                     static_cast<float>(scale),
                                     stored_scale.empty() ? nullptr : gpu<double>(stored_scale, op),
                                     rows, vocab_size, vocab_start, context.stream);
      });
}

void cross_entropy_forward_backward(Device& device, View losses, View logsumexp, View logits,
                                    View labels, double scale, int64_t rows, int64_t vocab_size,
                                    View stored_scale) {
  constexpr const char* op = "cross_entropy_forward_backward";
  if (!stored_scale.empty()) check_scalars(stored_scale, 1, "the stored scale", op);
  run_typed(
      device, op, 0, logits.type,
      [=](auto s) {
        using S = decltype(s);
        const double in_force = stored_scale.empty() ? scale : *host<double>(stored_scale);
        cpu::cross_entropy_forward_backward(host<S>(losses), host<S>(logsumexp), host<S>(logits),
                                            host_ids(labels), static_cast<S>(in_force), rows,
                                            vocab_size);
      },
      [&](auto s, const auto& context) {
        using S = decltype(s);
        cuda::cross_entropy_forward_backward(
            gpu<float>(losses, op), gpu<float>(logsumexp, op), gpu<S>(logits, op),
            gpu_ids(labels, op), static_cast<float>(scale),
            stored_scale.empty() ? nullptr : gpu<double>(stored_scale, op), rows, vocab_size,
            context.stream);
      });
}

void vocab_parallel_cross_entropy_partial(Device& device, View logsumexp_part,
                                          View target_logit, View logits, View labels,
                                          int64_t rows, int64_t vocab_size,
                                          int64_t vocab_start) {
  constexpr const char* op = "vocab_parallel_cross_entropy_partial";
  run_typed(
      device, op, 0, logits.type,
      [=](auto s) {
        using S = decltype(s);
        cpu::vocab_parallel_cross_entropy_partial(host<S>(logsumexp_part),
                                                  host<S>(target_logit), host<S>(logits),
                                                  host_ids(labels), rows, vocab_size,
                                                  vocab_start);
      },
      [&](auto s, const auto& context) {
        using S = decltype(s);
        cuda::vocab_parallel_cross_entropy_partial(
            gpu<float>(logsumexp_part, op), gpu<float>(target_logit, op), gpu<S>(logits, op),
            gpu_ids(labels, op), rows, vocab_size, vocab_start, context.stream);
      });
}

void vocab_parallel_cross_entropy_combine(Device& device, View losses, View logsumexp,
                                          View logsumexp_parts, View target_logit, View labels,
                                          int64_t rows, int64_t parts) {
  constexpr const char* op = "vocab_parallel_cross_entropy_combine";
  check_logsumexp_parts(logsumexp_parts.numel, rows, parts, op);
  run(
      device, op, 0,
      [=] {
        host_scalar(logsumexp_parts.type, op, [&](auto s) {
          using S = decltype(s);
          cpu::vocab_parallel_cross_entropy_combine(host<S>(losses), host<S>(logsumexp),
                                                    host<S>(logsumexp_parts),
                                                    host<S>(target_logit), host_ids(labels),
                                                    rows, parts);
        });
      },
      [&](const auto& context) {
        // fp32 whatever the logits' type: the views are checked to be f32.
        cuda::vocab_parallel_cross_entropy_combine(
            gpu<float>(losses, op), gpu<float>(logsumexp, op), gpu<float>(logsumexp_parts, op),
            gpu<float>(target_logit, op), gpu_ids(labels, op), rows, parts, context.stream);
      });
}

}  // namespace backend::ops
