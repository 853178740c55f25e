// Device: where the model's memory lives and its ops run, chosen at run time (--device). One
// virtual function per op family over Views (docs/device.md, "The device seam"): the model is
// written once against this interface; CpuDevice runs the CPU twins (backend/ops/*_cpu.cpp),
// a CUDA device their *_cuda.cu twins. A virtual call is nothing beside an op's work.
//
// Every op keeps its CPU twin's contract (the header in backend/ops/ that the comment names):
// parameter gradients accumulate (+=), activation gradients are overwritten (=), dropout masks
// are the same counter-based elements. An empty View is an absent tensor (a bias the
// configuration leaves out, a gradient that is not needed), as nullptr is for the twins. The
// views of one call share one element type (ids are i32); scalars travel as double and are
// rounded once to that type, as the twins take them. Errors are common::Error.
//
// Nevers kept here: no CUDA header, no global stream or handle (a device owns its own), no
// allocation in an op: scratch is carved at setup (arena.hpp).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "backend/device/device_memory.hpp"
#include "backend/device/view.hpp"
#include "backend/ops/adamw.hpp"
#include "backend/ops/dropout.hpp"
#include "backend/ops/rope.hpp"

namespace backend {

class Device {
 public:
  virtual ~Device() = default;

  virtual std::string name() const = 0;  // "cpu", "cuda:0 (NVIDIA H100 80GB HBM3)"
  virtual MemoryKind memory_kind() const = 0;

  // Memory: `what` names it in an out-of-memory error. Only arenas call this, at setup.
  virtual DeviceMemory allocate_zeroed(int64_t bytes, std::string_view what) = 0;
  // The bytes of this device's live allocations, now and at most so far (Megatron's memory
  // line; there is no caching allocator, so what is reserved is what is allocated).
  virtual MemoryUsage memory_usage() const = 0;
  virtual void copy_from_host(View destination, const void* source) = 0;  // destination.bytes()
  virtual void copy_to_host(void* destination, View source) = 0;          // source.bytes()
  virtual void fill_zero(View values) = 0;
  // destination = source, both this device's memory, of one element type and element count
  // (else common::Error naming both); they may be the same view, not otherwise overlap. In the
  // device's order of work, as its ops (a pipeline stage keeps what it received or sends a copy).
  virtual void copy(View destination, View source) = 0;
  // ops/convert.hpp: destination (bf16 or fp16) = source (f32) rounded to nearest even, of one
  // element count (else common::Error naming both): the working copy of the fp32 master weights.
  virtual void convert(View destination, View source) = 0;
  // ops/reduction.hpp: total (one f64 element) = Σ values, Σ values² or the count of zeros, in
  // a fixed order (the same bits run after run); values *= factor.
  virtual void sum(View total, View values) = 0;
  virtual void sum_of_squares(View total, View values) = 0;
  virtual void count_zeros(View total, View values) = 0;
  virtual void scale(View values, double factor) = 0;
  // ops/adamw.hpp: master, gradients and moments fp32; weights absent (fp32: the master is the
  // weights) or the bf16 working copy, written in the same pass.
  virtual void adamw_update(View master, View weights, View gradients, View exp_avg,
                            View exp_avg_sq, const AdamWCoefficients& coefficients) = 0;

  // ops/embedding.hpp; the word table (and its gradient) holds the rows of tokens
  // [vocab_start, vocab_start + numel / hidden_size): a vocabulary shard, or all of it at 0
  virtual void embedding_forward(View output, View tokens, View word_embeddings,
                                 View position_embeddings, int64_t batch_size,
                                 int64_t seq_length, int64_t hidden_size,
                                 int64_t vocab_start) = 0;
  // The backward takes the tokens' index (i32, index_tokens in ops/embedding.hpp: the caller
  // makes it on the host when it uploads the tokens) in place of the tokens.
  virtual void embedding_backward(View dword_embeddings, View dposition_embeddings, View doutput,
                                  View token_index, int64_t batch_size, int64_t seq_length,
                                  int64_t hidden_size, int64_t vocab_start) = 0;
  // ops/embedding.hpp, incremental decoding: N rows at positions of their own, whole vocabulary
  virtual void embedding_at_positions_forward(View output, View tokens, View positions,
                                              View word_embeddings, View position_embeddings,
                                              int64_t rows, int64_t hidden_size) = 0;
  // ops/dropout.hpp, over all of input's elements (element i is mask index first_index + i)
  virtual void dropout_forward(View output, View input, const Dropout& dropout) = 0;
  virtual void dropout_backward(View dinput, View doutput, const Dropout& dropout) = 0;
  // ops/layernorm.hpp
  virtual void layernorm_forward(View output, View mean, View rstd, View input, View weight,
                                 View bias, double weight_offset, double epsilon, int64_t rows,
                                 int64_t channels) = 0;
  virtual void layernorm_backward(View dinput, View dweight, View dbias, View doutput, View input,
                                  View weight, double weight_offset, View mean, View rstd,
                                  int64_t rows, int64_t channels) = 0;
  // ops/rmsnorm.hpp
  virtual void rmsnorm_forward(View output, View rstd, View input, View weight, double epsilon,
                               int64_t rows, int64_t channels) = 0;
  virtual void rmsnorm_backward(View dinput, View dweight, View doutput, View input, View weight,
                                View rstd, int64_t rows, int64_t channels) = 0;
  // ops/linear.hpp
  virtual void linear_forward(View output, View input, View weight, View bias, int64_t rows,
                              int64_t in_features, int64_t out_features) = 0;
  virtual void linear_backward(View dinput, View dweight, View dbias, View doutput, View input,
                               View weight, int64_t rows, int64_t in_features,
                               int64_t out_features) = 0;
  // ops/rope.hpp; the views start at the first rotated head of a row
  virtual void rope_tables(View cos, View sin, int64_t seq_length, int64_t rotary_dim,
                           double base, RopeScaling scaling) = 0;
  virtual void rope_forward(View output, View input, View cos, View sin, int64_t batch_size,
                            int64_t seq_length, int64_t num_heads, int64_t head_dim,
                            int64_t rotary_dim, int64_t row_stride) = 0;
  virtual void rope_backward(View dinput, View doutput, View cos, View sin, int64_t batch_size,
                             int64_t seq_length, int64_t num_heads, int64_t head_dim,
                             int64_t rotary_dim, int64_t row_stride) = 0;
  // ops/rope.hpp, incremental decoding: row r at position positions[r] of the tables
  virtual void rope_at_positions_forward(View output, View input, View cos, View sin,
                                         View positions, int64_t rows, int64_t num_heads,
                                         int64_t head_dim, int64_t rotary_dim,
                                         int64_t row_stride) = 0;
  // ops/attention.hpp
  virtual void attention_forward(View output, View logsumexp, View qkv, int64_t batch_size,
                                 int64_t seq_length, int64_t hidden_size, int64_t num_heads,
                                 int64_t num_query_groups, const Dropout& dropout) = 0;
  virtual void attention_backward(View dqkv, View doutput, View qkv, View output, View logsumexp,
                                  int64_t batch_size, int64_t seq_length, int64_t hidden_size,
                                  int64_t num_heads, int64_t num_query_groups,
                                  const Dropout& dropout) = 0;
  // ops/attention.hpp, incremental decoding: stores the rows' keys and values in one layer's
  // caches (S, L, NG, HD), then each row attends over its slot's positions 0..positions[r]
  virtual void kv_cache_attention_forward(View output, View key_cache, View value_cache,
                                          View qkv, View slots, View positions, int64_t rows,
                                          int64_t num_heads, int64_t num_query_groups,
                                          int64_t head_dim, int64_t max_length) = 0;
  // ops/residual.hpp, over all of input's elements
  virtual void residual_forward(View output, View input, View branch) = 0;
  // ops/gelu.hpp, over all of input's elements
  virtual void gelu_forward(View output, View input) = 0;
  virtual void gelu_backward(View dinput, View doutput, View input) = 0;
  // ops/swiglu.hpp
  virtual void swiglu_forward(View output, View input, int64_t rows, int64_t features) = 0;
  virtual void swiglu_backward(View dinput, View doutput, View input, int64_t rows,
                               int64_t features) = 0;
  // ops/cross_entropy.hpp; the backward's logits are the vocabulary columns [vocab_start,
  // vocab_start + vocab_size) and logsumexp the whole vocabulary's (0: the unsharded op)
  virtual void cross_entropy_forward(View losses, View logsumexp, View logits, View labels,
                                     int64_t rows, int64_t vocab_size) = 0;
  virtual void cross_entropy_backward(View dlogits, View logits, View logsumexp, View labels,
                                      double scale, int64_t rows, int64_t vocab_size,
                                      int64_t vocab_start) = 0;
  // The vocabulary-parallel forward (ops/cross_entropy.hpp): each shard's partial, an
  // all-gather of the partials and a sum of the target logits by the caller, then combine.
  virtual void vocab_parallel_cross_entropy_partial(View logsumexp_part, View target_logit,
                                                    View logits, View labels, int64_t rows,
                                                    int64_t vocab_size,
                                                    int64_t vocab_start) = 0;
  virtual void vocab_parallel_cross_entropy_combine(View losses, View logsumexp,
                                                    View logsumexp_parts, View target_logit,
                                                    View labels, int64_t rows,
                                                    int64_t parts) = 0;
};

}  // namespace backend
