// CpuDevice: the Device whose memory is the process's own and whose ops are the CPU twins
// (backend/ops/*_cpu.cpp) in fp32 or fp64: the reference every other device is checked
// against. Memory is anonymous pages the kernel zeroes on first touch
// (common/lazy_zero_allocator.hpp explains why that matters for the parameters).
#pragma once

#include <cstddef>
#include <vector>

#include "backend/device/device.hpp"

namespace backend {

class CpuDevice : public Device {
 public:
  std::string name() const override { return "cpu"; }
  MemoryKind memory_kind() const override { return MemoryKind::host; }

  DeviceMemory allocate_zeroed(int64_t bytes, std::string_view what) override;
  void copy_from_host(View destination, const void* source) override;
  void copy_to_host(void* destination, View source) override;
  void fill_zero(View values) override;
  void copy(View destination, View source) override;
  MemoryUsage memory_usage() const override { return ledger_.usage(); }
  void convert(View destination, View source) override;
  void sum(View total, View values) override;
  void sum_of_squares(View total, View values) override;
  void count_zeros(View total, View values) override;
  void scale(View values, double factor) override;
  void adamw_update(View master, View weights, View gradients, View exp_avg, View exp_avg_sq,
                    const AdamWCoefficients& coefficients) override;

  void embedding_forward(View output, View tokens, View word_embeddings, View position_embeddings,
                         int64_t batch_size, int64_t seq_length, int64_t hidden_size,
                         int64_t vocab_start) override;
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
  // attention's per-thread blocks (ops/attention.hpp's attention_scratch_per_thread × the
  // OpenMP threads), grown when a larger shape first runs and kept: a training step's shape is
  // the first step's, so later steps allocate nothing. One op runs at a time on a device.
  template <typename Scalar>
  Scalar* attention_scratch(int64_t seq_length, int64_t num_heads, int64_t num_query_groups);

  MemoryLedger ledger_;
  std::vector<std::max_align_t> attention_scratch_;
};

}  // namespace backend
