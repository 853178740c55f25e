// The parameter layout of the decoder gpt_model.hpp describes: every tensor's Megatron name,
// shape and offset into the one flat parameter buffer (and the gradient buffer of the same
// layout), the offsets the composition reads per layer, and Megatron's initialisation.
//
// Initialisation (Megatron's init_method_normal / scaled_init_method_normal): every weight
// element, including both embedding tables and the untied output_layer.weight, is
// N(0, init_method_std); linear_proj and linear_fc2 weights are N(0, init_method_std /
// sqrt(2 · num_layers)); biases are 0 and norm weights 1. Element i of the flat buffer depends
// only on (seed, i), never on the thread count or the order in which tensors are filled.
//
// Tensor parallelism (Megatron's ColumnParallelLinear, RowParallelLinear and
// VocabParallelEmbedding): a rank's layout holds its shard of each tensor. Split by rows (the
// output features): linear_qkv (whole query groups), linear_fc1 (with SwiGLU two blocks, rank r
// holding [gate_r | linear_r], as Megatron's checkpoints do), the column-parallel biases, the
// word embedding and output_layer (a contiguous range of the padded vocabulary). Split by
// columns (the input features): linear_proj and linear_fc2. Whole on every rank: the norms,
// the position table and the row-parallel biases. A shard is initialised with the values the
// whole tensor has at those elements (i is the element's index in the unsharded layout), as
// Megatron's --use-cpu-initialization does, so any tensor-parallel size starts from the same
// model as one rank.
//
// Pipeline parallelism (pipeline_stage.hpp): a stage's layout holds its tensors only: the
// embedding on the first stage, its chunks' layers (named by their global layer index, so that
// names are unique across stages and resharding is a matter of selection), the final norm and
// the output layer on the last. Elements keep their place in the whole model's initialisation
// stream, so any pipeline size starts from the one-process model too; the last stage's copy of
// a tied word embedding (output_layer.weight, tied_copy) draws the word embedding's values.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/model/gpt_config.hpp"
#include "backend/model/pipeline_stage.hpp"

namespace backend {

// How a tensor is divided among the tensor-parallel ranks (Megatron's partition_dim).
enum class TensorPartition { replicated, rows, columns };

struct ParameterTensor {
  std::string name;
  std::vector<int64_t> shape;  // this rank's shard (the whole tensor without tensor parallelism)
  int64_t offset = 0;          // into parameters() / gradients()
  int64_t numel = 0;
  bool weight_decay = true;  // false for biases and norm weights (Megatron's default)
  TensorPartition partition = TensorPartition::replicated;
  // Rows partition: the whole tensor's rows form this many equal blocks, each split over the
  // ranks (2 for SwiGLU's linear_fc1, [gate | linear]); otherwise 1.
  int64_t partition_blocks = 1;
  std::vector<int64_t> full_shape;  // the whole tensor's
  int64_t full_offset = 0;          // the whole tensor's offset in the unsharded layout
  // The last pipeline stage's copy of a tied word embedding (pipeline_stage.hpp): left out of
  // the gradient norm (Megatron's param_is_not_shared) and of a merged checkpoint.
  bool tied_copy = false;
};

// A contiguous run of a shard's elements: `numel` elements from `shard_offset` in the shard are
// those from `full_offset` in the whole tensor (both row-major, relative to the tensor's start).
struct ShardPiece {
  int64_t full_offset = 0;
  int64_t shard_offset = 0;
  int64_t numel = 0;
};
// The ranges of a rank's flat buffer that count towards the global gradient norm (Megatron's
// param_is_not_tensor_parallel_duplicate): every shard of a divided tensor, and the tensors
// every rank holds whole on rank 0 only, so that the norm's sum of squares, added over the
// tensor-parallel group, counts each element of the model once; a tied copy never counts (the
// first stage counts the word embedding). Adjacent ranges merged.
struct BufferRange {
  int64_t offset = 0;
  int64_t numel = 0;
};
std::vector<BufferRange> gradient_norm_ranges(const std::vector<ParameterTensor>& tensors,
                                              int64_t tensor_parallel_rank);

// Where tensor-parallel rank `rank`'s shard of `tensor` (its shape a shard of `tensor_parallel`)
// lies in the whole tensor, in shard order; one piece covering it all when replicated.
std::vector<ShardPiece> shard_pieces(const ParameterTensor& tensor, int64_t tensor_parallel,
                                     int64_t rank);

// The same shard as boxes of the whole tensor, for stores that keep a tensor by boxes (PyTorch
// Distributed Checkpoint's chunks): each box's offsets and sizes along every axis, and where
// its elements (row-major) start in the shard. One box when replicated or split by columns, one
// per block when split by rows (SwiGLU's fc1: its gate part, then its up part).
struct ShardBox {
  std::vector<int64_t> offsets, sizes;
  int64_t shard_offset = 0;
};
std::vector<ShardBox> shard_boxes(const ParameterTensor& tensor, int64_t rank);

// The offset of a tensor the configuration leaves out (a norm bias with RMSNorm, a linear bias
// with --disable-bias-linear, the position table with RoPE).
constexpr int64_t kAbsentTensor = -1;

// Offsets into the flat buffers of one transformer layer's tensors.
struct LayerParameters {
  int64_t input_norm_weight, input_norm_bias;
  int64_t qkv_weight, qkv_bias;
  int64_t proj_weight, proj_bias;
  int64_t mlp_norm_weight, mlp_norm_bias;
  int64_t fc1_weight, fc1_bias;
  int64_t fc2_weight, fc2_bias;
};

enum class ParameterInit { normal, scaled_normal, zeros, ones };

class ParameterLayout {
 public:
  // config already validated; with tensor_parallel > 1 the layout of rank
  // `tensor_parallel_rank`'s shards (check_tensor_parallel() is applied), of `stage`'s tensors
  // (check_pipeline_stage() is applied).
  explicit ParameterLayout(const GptConfig& config, int64_t tensor_parallel = 1,
                           int64_t tensor_parallel_rank = 0, const PipelineStage& stage = {});

  const std::vector<ParameterTensor>& tensors() const { return tensors_; }
  const ParameterTensor& tensor(const std::string& name) const;  // common::Error if unknown
  int64_t numel() const { return tensors_.back().offset + tensors_.back().numel; }
  int64_t tensor_parallel() const { return tensor_parallel_; }
  int64_t tensor_parallel_rank() const { return tensor_parallel_rank_; }
  int64_t num_layers() const { return num_layers_; }  // of the whole model

  const PipelineStage& stage() const { return stage_; }
  // The stage's chunks' layers (one range covering every layer without pipeline parallelism).
  const std::vector<LayerRange>& chunks() const { return chunks_; }

  // kAbsentTensor off the first stage.
  int64_t word_embeddings() const { return word_embeddings_; }
  int64_t position_embeddings() const { return position_embeddings_; }  // or kAbsentTensor
  // Layer l by its global index: every offset kAbsentTensor for a layer of another stage.
  const LayerParameters& layer(int64_t l) const { return layers_[static_cast<size_t>(l)]; }
  int64_t final_norm_weight() const { return final_norm_weight_; }
  int64_t final_norm_bias() const { return final_norm_bias_; }
  // The logits' weight: output_layer.weight when untied (or the last stage's tied copy), else
  // the word embedding. These three are kAbsentTensor off the last stage.
  int64_t output_weight() const { return output_weight_; }

  // Megatron's initialisation of `values` (numel() elements of this layout).
  template <typename Scalar>
  void init_parameters(Scalar* values, uint64_t seed) const;

 private:
  // Adds the tensor when `held` (returns its offset), else only counts its place in the whole
  // model's initialisation stream (returns kAbsentTensor).
  int64_t add(std::string name, std::vector<int64_t> shape, ParameterInit init,
              TensorPartition partition = TensorPartition::replicated, int64_t blocks = 1,
              bool held = true);

  int64_t tensor_parallel_ = 1;
  int64_t tensor_parallel_rank_ = 0;
  PipelineStage stage_;
  std::vector<LayerRange> chunks_;
  int64_t full_numel_ = 0;  // of the unsharded layout so far
  int64_t num_layers_ = 0;
  double init_method_std_ = 0;
  std::vector<ParameterTensor> tensors_;
  std::vector<ParameterInit> tensor_init_;  // parallel to tensors_
  std::unordered_map<std::string, size_t> tensor_index_;
  int64_t word_embeddings_ = 0;
  int64_t position_embeddings_ = kAbsentTensor;
  std::vector<LayerParameters> layers_;
  int64_t final_norm_weight_ = 0;
  int64_t final_norm_bias_ = kAbsentTensor;
  int64_t output_weight_ = 0;
};

extern template void ParameterLayout::init_parameters<float>(float*, uint64_t) const;
extern template void ParameterLayout::init_parameters<double>(double*, uint64_t) const;

}  // namespace backend
