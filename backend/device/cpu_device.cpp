// CpuDevice: each op picks the CPU twin of the views' element type (fp32 or fp64) and calls
// it; the twins keep the contracts (backend/ops/). bf16 and fp16 have no CPU kernels: asking
// for them here is refused with the reason rather than computed in another precision.
#include "backend/device/cpu_device.hpp"

#include <sys/mman.h>

#include <omp.h>

#include <cerrno>
#include <cstring>

#include "backend/common/error.hpp"
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

// Calls function(Scalar{}) with Scalar the C++ type of `dtype`.
template <typename Function>
void dispatch(ElementType dtype, const char* op, Function&& function) {
  switch (dtype) {
    case ElementType::f32: function(float{}); return;
    case ElementType::f64: function(double{}); return;
    default:
      common::fail("the CPU device computes in fp32 or fp64; {} has no {} kernel on it (bf16 and "
                   "fp16 run on --device cuda)",
                   op, element_name(dtype));
  }
}

// The view's bytes, whatever their type (for copies): the view must be host memory.
void* host_bytes(View view) {
  if (!view.empty() && view.on != MemoryKind::host) {
    common::fail("the CPU device was given GPU memory ({} elements of {})", view.numel,
                 element_name(view.type));
  }
  return view.data;
}

// The view's elements as S*: host memory of type S (or empty: nullptr).
template <typename S>
S* host(View view) {
  host_bytes(view);
  return view.as<S>();
}

const int32_t* ids(View view) { return host<int32_t>(view); }

void release_host(void* data, int64_t bytes) noexcept { munmap(data, static_cast<size_t>(bytes)); }

}  // namespace

// Anonymous pages: aligned to the page (more than an arena's 256 bytes), and zeroed by the
// kernel when first touched, by whichever thread touches them, so carving a large arena costs
// no pass over it and the first writer's NUMA node gets the page.
DeviceMemory CpuDevice::allocate_zeroed(int64_t bytes, std::string_view what) {
  if (bytes == 0) return {};
  void* data = mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (data == MAP_FAILED) {
    common::fail("out of host memory allocating {} bytes for {}: {}", bytes, what,
                 std::strerror(errno));
  }
  return DeviceMemory(data, bytes, MemoryKind::host, release_host, &ledger_);
}

void CpuDevice::copy_from_host(View destination, const void* source) {
  if (destination.bytes() > 0) std::memcpy(host_bytes(destination), source, destination.bytes());
}

void CpuDevice::copy_to_host(void* destination, View source) {
  if (source.bytes() > 0) std::memcpy(destination, host_bytes(source), source.bytes());
}

// Bytes of any element type (bf16 too: nothing is computed). memmove: the same view is allowed.
void CpuDevice::copy(View destination, View source) {
  check_same_extent(destination, source, "copy");
  void* to = host_bytes(destination);
  const void* from = host_bytes(source);
  if (to != from && source.bytes() > 0) {
    std::memmove(to, from, static_cast<size_t>(source.bytes()));
  }
}

// A conversion computes nothing in bf16 or fp16, so the CPU device makes working copies too
// (its own ops still refuse to read them).
void CpuDevice::convert(View destination, View source) {
  check_convertible(destination, source, "convert");
  if (destination.type == ElementType::f16) {
    cpu::convert(host<float16>(destination), host<float>(source), source.numel);
  } else {
    cpu::convert(host<bfloat16>(destination), host<float>(source), source.numel);
  }
}

void CpuDevice::fill_zero(View values) {
  dispatch(values.type, "fill_zero", [&](auto s) {
    using S = decltype(s);
    S* data = host<S>(values);
    const int64_t count = values.numel;
    // Half a gigabyte of gradients at the 126M shape: one core alone does not reach the
    // memory bandwidth.
#pragma omp parallel for simd schedule(static) if (count > (1 << 16))
    for (int64_t i = 0; i < count; ++i) data[i] = S{0};
  });
}

void CpuDevice::sum(View total, View values) {
  double* result = host<double>(total);
  if (result == nullptr || total.numel != 1) common::fail("sum: the total must be one f64");
  dispatch(values.type, "sum", [&](auto s) {
    using S = decltype(s);
    cpu::sum(result, host<S>(values), values.numel);
  });
}

void CpuDevice::sum_of_squares(View total, View values) {
  double* result = host<double>(total);
  if (result == nullptr || total.numel != 1) {
    common::fail("sum_of_squares: the total must be one f64");
  }
  dispatch(values.type, "sum_of_squares", [&](auto s) {
    using S = decltype(s);
    cpu::sum_of_squares(result, host<S>(values), values.numel);
  });
}

void CpuDevice::count_zeros(View total, View values) {
  double* result = host<double>(total);
  if (result == nullptr || total.numel != 1) {
    common::fail("count_zeros: the total must be one f64");
  }
  dispatch(values.type, "count_zeros", [&](auto s) {
    using S = decltype(s);
    cpu::count_zeros(result, host<S>(values), values.numel);
  });
}

void CpuDevice::scale(View values, double factor) {
  dispatch(values.type, "scale", [&](auto s) {
    using S = decltype(s);
    cpu::scale(host<S>(values), factor, values.numel);
  });
}

void CpuDevice::adamw_update(View master, View weights, View gradients, View exp_avg,
                             View exp_avg_sq, const AdamWCoefficients& coefficients) {
  if (!weights.empty()) {
    common::fail("adamw_update: the CPU device keeps fp32 weights, which are the master weights; "
                 "a separate {} working copy is the CUDA device's mixed precision",
                 element_name(weights.type));
  }
  const int64_t count = master.numel;
  for (const View* view : {&gradients, &exp_avg, &exp_avg_sq}) {
    if (view->numel != count) {
      common::fail("adamw_update: {} master weights but a view of {} elements", count,
                   view->numel);
    }
  }
  cpu::adamw_update(host<float>(master), host<float>(gradients), host<float>(exp_avg),
                    host<float>(exp_avg_sq), count, coefficients);
}

void CpuDevice::embedding_forward(View output, View tokens, View word_embeddings,
                                  View position_embeddings, int64_t batch_size,
                                  int64_t seq_length, int64_t hidden_size, int64_t vocab_start) {
  const int64_t vocab_size =
      embedding_table_rows(word_embeddings.numel, hidden_size, "embedding_forward");
  dispatch(output.type, "embedding_forward", [&](auto s) {
    using S = decltype(s);
    cpu::embedding_forward(host<S>(output), ids(tokens), host<S>(word_embeddings),
                           host<S>(position_embeddings), batch_size, seq_length, hidden_size,
                           vocab_start, vocab_size);
  });
}

void CpuDevice::embedding_backward(View dword_embeddings, View dposition_embeddings, View doutput,
                                   View token_index, int64_t batch_size, int64_t seq_length,
                                   int64_t hidden_size, int64_t vocab_start) {
  const int64_t vocab_size =
      embedding_table_rows(dword_embeddings.numel, hidden_size, "embedding_backward");
  check_token_index(token_index.numel, batch_size * seq_length, "embedding_backward");
  dispatch(doutput.type, "embedding_backward", [&](auto s) {
    using S = decltype(s);
    cpu::embedding_backward(host<S>(dword_embeddings), host<S>(dposition_embeddings),
                            host<S>(doutput), ids(token_index), batch_size, seq_length,
                            hidden_size, vocab_start, vocab_size);
  });
}

void CpuDevice::embedding_at_positions_forward(View output, View tokens, View positions,
                                               View word_embeddings, View position_embeddings,
                                               int64_t rows, int64_t hidden_size) {
  dispatch(output.type, "embedding_at_positions_forward", [&](auto s) {
    using S = decltype(s);
    cpu::embedding_at_positions_forward(host<S>(output), ids(tokens), ids(positions),
                                        host<S>(word_embeddings), host<S>(position_embeddings),
                                        rows, hidden_size);
  });
}

void CpuDevice::dropout_forward(View output, View input, const Dropout& dropout) {
  dispatch(input.type, "dropout_forward", [&](auto s) {
    using S = decltype(s);
    cpu::dropout_forward(host<S>(output), host<S>(input), input.numel, dropout);
  });
}

void CpuDevice::dropout_backward(View dinput, View doutput, const Dropout& dropout) {
  dispatch(doutput.type, "dropout_backward", [&](auto s) {
    using S = decltype(s);
    cpu::dropout_backward(host<S>(dinput), host<S>(doutput), doutput.numel, dropout);
  });
}

void CpuDevice::layernorm_forward(View output, View mean, View rstd, View input, View weight,
                                  View bias, double weight_offset, double epsilon, int64_t rows,
                                  int64_t channels) {
  dispatch(input.type, "layernorm_forward", [&](auto s) {
    using S = decltype(s);
    cpu::layernorm_forward(host<S>(output), host<S>(mean), host<S>(rstd), host<S>(input),
                           host<S>(weight), host<S>(bias), static_cast<S>(weight_offset),
                           static_cast<S>(epsilon), rows, channels);
  });
}

void CpuDevice::layernorm_backward(View dinput, View dweight, View dbias, View doutput,
                                   View input, View weight, double weight_offset, View mean,
                                   View rstd, int64_t rows, int64_t channels) {
  dispatch(input.type, "layernorm_backward", [&](auto s) {
    using S = decltype(s);
    cpu::layernorm_backward(host<S>(dinput), host<S>(dweight), host<S>(dbias), host<S>(doutput),
                            host<S>(input), host<S>(weight), static_cast<S>(weight_offset),
                            host<S>(mean), host<S>(rstd), rows, channels);
  });
}

void CpuDevice::rmsnorm_forward(View output, View rstd, View input, View weight, double epsilon,
                                int64_t rows, int64_t channels) {
  dispatch(input.type, "rmsnorm_forward", [&](auto s) {
    using S = decltype(s);
    cpu::rmsnorm_forward(host<S>(output), host<S>(rstd), host<S>(input), host<S>(weight),
                         static_cast<S>(epsilon), rows, channels);
  });
}

void CpuDevice::rmsnorm_backward(View dinput, View dweight, View doutput, View input, View weight,
                                 View rstd, int64_t rows, int64_t channels) {
  dispatch(input.type, "rmsnorm_backward", [&](auto s) {
    using S = decltype(s);
    cpu::rmsnorm_backward(host<S>(dinput), host<S>(dweight), host<S>(doutput), host<S>(input),
                          host<S>(weight), host<S>(rstd), rows, channels);
  });
}

void CpuDevice::linear_forward(View output, View input, View weight, View bias, int64_t rows,
                               int64_t in_features, int64_t out_features) {
  dispatch(input.type, "linear_forward", [&](auto s) {
    using S = decltype(s);
    cpu::linear_forward(host<S>(output), host<S>(input), host<S>(weight), host<S>(bias), rows,
                        in_features, out_features);
  });
}

void CpuDevice::linear_backward(View dinput, View dweight, View dbias, View doutput, View input,
                                View weight, int64_t rows, int64_t in_features,
                                int64_t out_features) {
  dispatch(input.type, "linear_backward", [&](auto s) {
    using S = decltype(s);
    cpu::linear_backward(host<S>(dinput), host<S>(dweight), host<S>(dbias), host<S>(doutput),
                         host<S>(input), host<S>(weight), rows, in_features, out_features);
  });
}

void CpuDevice::rope_tables(View cos, View sin, int64_t seq_length, int64_t rotary_dim,
                            double base, RopeScaling scaling) {
  dispatch(cos.type, "rope_tables", [&](auto s) {
    using S = decltype(s);
    cpu::rope_tables(host<S>(cos), host<S>(sin), seq_length, rotary_dim, base, scaling);
  });
}

void CpuDevice::rope_forward(View output, View input, View cos, View sin, int64_t batch_size,
                             int64_t seq_length, int64_t num_heads, int64_t head_dim,
                             int64_t rotary_dim, int64_t row_stride) {
  dispatch(input.type, "rope_forward", [&](auto s) {
    using S = decltype(s);
    cpu::rope_forward(host<S>(output), host<S>(input), host<S>(cos), host<S>(sin), batch_size,
                      seq_length, num_heads, head_dim, rotary_dim, row_stride);
  });
}

void CpuDevice::rope_at_positions_forward(View output, View input, View cos, View sin,
                                          View positions, int64_t rows, int64_t num_heads,
                                          int64_t head_dim, int64_t rotary_dim,
                                          int64_t row_stride) {
  dispatch(input.type, "rope_at_positions_forward", [&](auto s) {
    using S = decltype(s);
    cpu::rope_at_positions_forward(host<S>(output), host<S>(input), host<S>(cos), host<S>(sin),
                                   ids(positions), rows, num_heads, head_dim, rotary_dim,
                                   row_stride);
  });
}

void CpuDevice::rope_backward(View dinput, View doutput, View cos, View sin, int64_t batch_size,
                              int64_t seq_length, int64_t num_heads, int64_t head_dim,
                              int64_t rotary_dim, int64_t row_stride) {
  dispatch(doutput.type, "rope_backward", [&](auto s) {
    using S = decltype(s);
    cpu::rope_backward(host<S>(dinput), host<S>(doutput), host<S>(cos), host<S>(sin), batch_size,
                       seq_length, num_heads, head_dim, rotary_dim, row_stride);
  });
}

template <typename Scalar>
Scalar* CpuDevice::attention_scratch(int64_t seq_length, int64_t num_heads,
                                     int64_t num_query_groups) {
  if (seq_length <= 0 || num_query_groups <= 0 || num_heads % num_query_groups != 0) {
    return nullptr;  // the op refuses the shape, or has nothing to do
  }
  const int64_t scalars = static_cast<int64_t>(omp_get_max_threads()) *
                          cpu::attention_scratch_per_thread(seq_length,
                                                            num_heads / num_query_groups);
  const auto words = static_cast<size_t>(
      (scalars * int64_t{sizeof(Scalar)} + int64_t{sizeof(std::max_align_t)} - 1) /
      int64_t{sizeof(std::max_align_t)});
  if (attention_scratch_.size() < words) attention_scratch_.resize(words);
  return reinterpret_cast<Scalar*>(attention_scratch_.data());
}

void CpuDevice::attention_forward(View output, View logsumexp, View qkv, int64_t batch_size,
                                  int64_t seq_length, int64_t hidden_size, int64_t num_heads,
                                  int64_t num_query_groups, const Dropout& dropout) {
  dispatch(qkv.type, "attention_forward", [&](auto s) {
    using S = decltype(s);
    cpu::attention_forward(host<S>(output), host<S>(logsumexp), host<S>(qkv), batch_size,
                           seq_length, hidden_size, num_heads, num_query_groups, dropout, {},
                           attention_scratch<S>(seq_length, num_heads, num_query_groups));
  });
}

void CpuDevice::attention_backward(View dqkv, View doutput, View qkv, View output, View logsumexp,
                                   int64_t batch_size, int64_t seq_length, int64_t hidden_size,
                                   int64_t num_heads, int64_t num_query_groups,
                                   const Dropout& dropout) {
  dispatch(qkv.type, "attention_backward", [&](auto s) {
    using S = decltype(s);
    cpu::attention_backward(host<S>(dqkv), host<S>(doutput), host<S>(qkv), host<S>(output),
                            host<S>(logsumexp), batch_size, seq_length, hidden_size, num_heads,
                            num_query_groups, dropout, {},
                            attention_scratch<S>(seq_length, num_heads, num_query_groups));
  });
}

void CpuDevice::kv_cache_attention_forward(View output, View key_cache, View value_cache,
                                           View qkv, View slots, View positions, int64_t rows,
                                           int64_t num_heads, int64_t num_query_groups,
                                           int64_t head_dim, int64_t max_length) {
  dispatch(qkv.type, "kv_cache_attention_forward", [&](auto s) {
    using S = decltype(s);
    cpu::kv_cache_attention_forward(host<S>(output), host<S>(key_cache), host<S>(value_cache),
                                    host<S>(qkv), ids(slots), ids(positions), rows, num_heads,
                                    num_query_groups, head_dim, max_length);
  });
}

void CpuDevice::residual_forward(View output, View input, View branch) {
  dispatch(input.type, "residual_forward", [&](auto s) {
    using S = decltype(s);
    cpu::residual_forward(host<S>(output), host<S>(input), host<S>(branch), input.numel);
  });
}

void CpuDevice::gelu_forward(View output, View input) {
  dispatch(input.type, "gelu_forward", [&](auto s) {
    using S = decltype(s);
    cpu::gelu_forward(host<S>(output), host<S>(input), input.numel);
  });
}

void CpuDevice::gelu_backward(View dinput, View doutput, View input) {
  dispatch(input.type, "gelu_backward", [&](auto s) {
    using S = decltype(s);
    cpu::gelu_backward(host<S>(dinput), host<S>(doutput), host<S>(input), input.numel);
  });
}

void CpuDevice::swiglu_forward(View output, View input, int64_t rows, int64_t features) {
  dispatch(input.type, "swiglu_forward", [&](auto s) {
    using S = decltype(s);
    cpu::swiglu_forward(host<S>(output), host<S>(input), rows, features);
  });
}

void CpuDevice::swiglu_backward(View dinput, View doutput, View input, int64_t rows,
                                int64_t features) {
  dispatch(input.type, "swiglu_backward", [&](auto s) {
    using S = decltype(s);
    cpu::swiglu_backward(host<S>(dinput), host<S>(doutput), host<S>(input), rows, features);
  });
}

void CpuDevice::cross_entropy_forward(View losses, View logsumexp, View logits, View labels,
                                      int64_t rows, int64_t vocab_size) {
  dispatch(logits.type, "cross_entropy_forward", [&](auto s) {
    using S = decltype(s);
    cpu::cross_entropy_forward(host<S>(losses), host<S>(logsumexp), host<S>(logits), ids(labels),
                               rows, vocab_size);
  });
}

void CpuDevice::cross_entropy_backward(View dlogits, View logits, View logsumexp, View labels,
                                       double scale, int64_t rows, int64_t vocab_size,
                                       int64_t vocab_start) {
  dispatch(logits.type, "cross_entropy_backward", [&](auto s) {
    using S = decltype(s);
    cpu::cross_entropy_backward(host<S>(dlogits), host<S>(logits), host<S>(logsumexp),
                                ids(labels), static_cast<S>(scale), rows, vocab_size,
                                vocab_start);
  });
}

void CpuDevice::vocab_parallel_cross_entropy_partial(View logsumexp_part, View target_logit,
                                                     View logits, View labels, int64_t rows,
                                                     int64_t vocab_size, int64_t vocab_start) {
  dispatch(logits.type, "vocab_parallel_cross_entropy_partial", [&](auto s) {
    using S = decltype(s);
    cpu::vocab_parallel_cross_entropy_partial(host<S>(logsumexp_part), host<S>(target_logit),
                                              host<S>(logits), ids(labels), rows, vocab_size,
                                              vocab_start);
  });
}

void CpuDevice::vocab_parallel_cross_entropy_combine(View losses, View logsumexp,
                                                     View logsumexp_parts, View target_logit,
                                                     View labels, int64_t rows, int64_t parts) {
  constexpr const char* op = "vocab_parallel_cross_entropy_combine";
  check_logsumexp_parts(logsumexp_parts.numel, rows, parts, op);
  dispatch(logsumexp_parts.type, op, [&](auto s) {
    using S = decltype(s);
    cpu::vocab_parallel_cross_entropy_combine(host<S>(losses), host<S>(logsumexp),
                                              host<S>(logsumexp_parts), host<S>(target_logit),
                                              ids(labels), rows, parts);
  });
}

}  // namespace backend
