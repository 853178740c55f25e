// ParameterLayout: the tensors in Megatron core's state-dict order, and their initialisation.
// The normal deviates come from a counter-based generator: element i is Φ⁻¹ of a uniform made
// from splitmix64 output i (Steele, Lea & Flood 2014) of a stream keyed by splitmix64(seed), by
// Wichura's AS 241 (common/inverse_normal_cdf.hpp; it replaced a Box–Muller transform, whose
// logarithm and sine/cosine per pair made the 126M model's initialisation take seconds). It is
// computed in double and rounded to Scalar, so a float and a double model with the same seed
// hold the same parameters up to float rounding.
#include "backend/model/parameter_layout.hpp"

#include <algorithm>
#include <cmath>
#include <utility>

#include "backend/common/checked_math.hpp"
#include "backend/common/error.hpp"
#include "backend/common/inverse_normal_cdf.hpp"
#include "backend/common/splitmix64.hpp"

namespace backend {
namespace {

// values[j] = Scalar(scale · deviate first + j of the stream keyed by `key`), j < count ≤
// kNormalBlock: common::standard_normal_at, in two passes so the common case vectorises: the
// central rational function for every element (85 % need nothing else), then the tails
// (|p − 1/2| > 0.425, a logarithm and a square root) one by one.
constexpr int64_t kNormalBlock = 512;
template <typename Scalar>
void fill_normal_block(Scalar* values, int64_t count, uint64_t key, uint64_t first, double scale) {
  double deviates[kNormalBlock];
  double uniforms[kNormalBlock];
#pragma omp simd
  for (int64_t j = 0; j < count; ++j) {
    uniforms[j] = common::normal_uniform_at(key, first + static_cast<uint64_t>(j));
    deviates[j] = common::central_inverse_normal_cdf(uniforms[j] - 0.5);
  }
  for (int64_t j = 0; j < count; ++j) {
    if (std::abs(uniforms[j] - 0.5) > common::kCentralHalfWidth) {
      deviates[j] = common::inverse_normal_cdf(uniforms[j]);
    }
  }
#pragma omp simd
  for (int64_t j = 0; j < count; ++j) values[j] = static_cast<Scalar>(scale * deviates[j]);
}

}  // namespace

std::vector<ShardPiece> shard_pieces(const ParameterTensor& tensor, int64_t tensor_parallel,
                                     int64_t rank) {
  if (tensor.partition == TensorPartition::replicated || tensor_parallel == 1) {
    return {{0, 0, tensor.numel}};
  }
  const int64_t rows = tensor.shape[0];
  const int64_t columns = tensor.shape.size() > 1 ? tensor.shape[1] : 1;
  std::vector<ShardPiece> pieces;
  if (tensor.partition == TensorPartition::rows) {
    // Block j of the whole tensor's rows holds every rank's j-th part, rank order.
    const int64_t part_rows = rows / tensor.partition_blocks;
    const int64_t block_rows = part_rows * tensor_parallel;
    for (int64_t j = 0; j < tensor.partition_blocks; ++j) {
      pieces.push_back({(j * block_rows + rank * part_rows) * columns, j * part_rows * columns,
                        part_rows * columns});
    }
    return pieces;
  }
  // Columns: each row's segment of this rank's input features.
  const int64_t full_columns = columns * tensor_parallel;
  pieces.reserve(static_cast<size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) {
    pieces.push_back({i * full_columns + rank * columns, i * columns, columns});
  }
  return pieces;
}

std::vector<ShardBox> shard_boxes(const ParameterTensor& tensor, int64_t rank) {
  const std::vector<int64_t>& shape = tensor.shape;
  const std::vector<int64_t> zeros(shape.size(), 0);
  switch (tensor.partition) {
    case TensorPartition::replicated:
      break;
    case TensorPartition::rows: {
      int64_t row = 1;
      for (size_t axis = 1; axis < shape.size(); ++axis) row *= shape[axis];
      const int64_t blocks = tensor.partition_blocks;
      const int64_t rows = shape[0] / blocks;
      std::vector<ShardBox> boxes;
      for (int64_t block = 0; block < blocks; ++block) {
        ShardBox box{zeros, shape, block * rows * row};
        box.offsets[0] = block * (tensor.full_shape[0] / blocks) + rank * rows;
        box.sizes[0] = rows;
        boxes.push_back(std::move(box));
      }
      return boxes;
    }
    case TensorPartition::columns: {
      ShardBox box{zeros, shape, 0};
      box.offsets[1] = rank * shape[1];
      return {box};
    }
  }
  return {{zeros, shape, 0}};
}

std::vector<BufferRange> gradient_norm_ranges(const std::vector<ParameterTensor>& tensors,
                                              int64_t tensor_parallel_rank) {
  std::vector<BufferRange> ranges;
  for (const ParameterTensor& tensor : tensors) {
    if (tensor.tied_copy) continue;
    if (tensor.partition == TensorPartition::replicated && tensor_parallel_rank != 0) continue;
    if (!ranges.empty() && ranges.back().offset + ranges.back().numel == tensor.offset) {
      ranges.back().numel += tensor.numel;
    } else {
      ranges.push_back({tensor.offset, tensor.numel});
    }
  }
  return ranges;
}

ParameterLayout::ParameterLayout(const GptConfig& full_config, int64_t tensor_parallel,
                                 int64_t tensor_parallel_rank, const PipelineStage& stage)
    : tensor_parallel_(tensor_parallel),
      tensor_parallel_rank_(tensor_parallel_rank),
      stage_(stage),
      chunks_(stage_layer_chunks(full_config.num_layers, stage)),
      num_layers_(full_config.num_layers),
      init_method_std_(full_config.init_method_std) {
  if (tensor_parallel_rank < 0 || tensor_parallel_rank >= tensor_parallel) {
    common::fail("tensor-parallel rank {} is outside [0, {})", tensor_parallel_rank,
                 tensor_parallel);
  }
  // The shapes below are the rank's shard; add() derives the whole tensor's from the partition.
  const GptConfig config =
      tensor_parallel > 1 ? tensor_parallel_shard(full_config, tensor_parallel) : full_config;
  const int64_t C = config.hidden_size;
  const int64_t A = config.attention_features();
  constexpr auto rows = TensorPartition::rows;
  constexpr auto columns = TensorPartition::columns;
  const int64_t fc1_blocks = config.swiglu ? 2 : 1;
  const int64_t F = config.ffn_hidden_size;
  const int64_t F1 = config.fc1_features();
  const int64_t QKV = config.qkv_features();
  const bool rms_norm = config.normalization == Normalization::rms_norm;
  // Which tensors this stage holds: all of them without pipeline parallelism. `held` is the
  // current group's (the embedding, a layer, the head); every tensor is counted either way, so
  // held ones keep their place in the whole model's initialisation stream.
  bool held = stage.first();
  // Optional tensors: added when the configuration has them, else kAbsentTensor.
  auto norm_bias = [&](std::string name) {
    return rms_norm ? kAbsentTensor : add(std::move(name), {C}, ParameterInit::zeros,
                                          TensorPartition::replicated, 1, held);
  };
  auto linear_bias = [&](std::string name, int64_t features,
                         TensorPartition partition = TensorPartition::replicated,
                         int64_t blocks = 1) {
    return config.add_bias_linear
               ? add(std::move(name), {features}, ParameterInit::zeros, partition, blocks, held)
               : kAbsentTensor;
  };
  constexpr auto replicated = TensorPartition::replicated;
  const int64_t word_full_offset = full_numel_;
  word_embeddings_ = add("embedding.word_embeddings.weight", {config.padded_vocab_size, C},
                         ParameterInit::normal, rows, 1, held);
  if (config.position_embedding_type != PositionEmbeddingType::rope) {
    position_embeddings_ = add("embedding.position_embeddings.weight",
                               {config.max_position_embeddings, C}, ParameterInit::normal,
                               replicated, 1, held);
  }
  // The norms' weights are γ, or γ − 1 with --apply-layernorm-1p: γ starts at 1 either way.
  const ParameterInit norm_init =
      config.apply_layernorm_1p ? ParameterInit::zeros : ParameterInit::ones;
  for (int64_t i = 0; i < config.num_layers; ++i) {
    held = holds_layer(chunks_, i);
    const std::string prefix = "decoder.layers." + std::to_string(i) + ".";
    LayerParameters layer{};
    layer.input_norm_weight =
        add(prefix + "input_layernorm.weight", {C}, norm_init, replicated, 1, held);
    layer.input_norm_bias = norm_bias(prefix + "input_layernorm.bias");
    layer.qkv_weight = add(prefix + "self_attention.linear_qkv.weight", {QKV, C},
                           ParameterInit::normal, rows, 1, held);
    layer.qkv_bias = linear_bias(prefix + "self_attention.linear_qkv.bias", QKV, rows);
    layer.proj_weight = add(prefix + "self_attention.linear_proj.weight", {C, A},
                            ParameterInit::scaled_normal, columns, 1, held);
    layer.proj_bias = linear_bias(prefix + "self_attention.linear_proj.bias", C);
    layer.mlp_norm_weight =
        add(prefix + "pre_mlp_layernorm.weight", {C}, norm_init, replicated, 1, held);
    layer.mlp_norm_bias = norm_bias(prefix + "pre_mlp_layernorm.bias");
    layer.fc1_weight = add(prefix + "mlp.linear_fc1.weight", {F1, C}, ParameterInit::normal, rows,
                           fc1_blocks, held);
    layer.fc1_bias = linear_bias(prefix + "mlp.linear_fc1.bias", F1, rows, fc1_blocks);
    layer.fc2_weight = add(prefix + "mlp.linear_fc2.weight", {C, F}, ParameterInit::scaled_normal,
                           columns, 1, held);
    layer.fc2_bias = linear_bias(prefix + "mlp.linear_fc2.bias", C);
    layers_.push_back(layer);
  }
  held = stage.last();
  final_norm_weight_ =
      add("decoder.final_layernorm.weight", {C}, norm_init, replicated, 1, held);
  final_norm_bias_ = norm_bias("decoder.final_layernorm.bias");
  if (!config.share_embeddings_and_output_weights) {
    output_weight_ = add("output_layer.weight", {config.padded_vocab_size, C},
                         ParameterInit::normal, rows, 1, held);
  } else if (stage.first() || !held) {
    output_weight_ = held ? word_embeddings_ : kAbsentTensor;
  } else {
    // The last stage's copy of the tied word embedding: the word embedding's values.
    const int64_t counted = full_numel_;
    full_numel_ = word_full_offset;
    output_weight_ = add("output_layer.weight", {config.padded_vocab_size, C},
                         ParameterInit::normal, rows, 1, true);
    full_numel_ = counted;
    tensors_.back().tied_copy = true;
  }
  if (tensors_.empty()) common::fail("pipeline stage {} holds no parameters", stage.rank);
}

int64_t ParameterLayout::add(std::string name, std::vector<int64_t> shape, ParameterInit init,
                             TensorPartition partition, int64_t blocks, bool held) {
  // validate() checked the whole layout's sizes; these checks keep each step honest too.
  int64_t numel = 1;
  for (int64_t extent : shape) numel = common::checked_multiply(numel, extent, name);
  const int64_t offset =
      tensors_.empty() ? 0 : common::checked_add(tensors_.back().offset, tensors_.back().numel, name);
  // Megatron's default: no weight decay on biases and norm parameters (the 1-D tensors).
  const bool weight_decay = shape.size() > 1;
  std::vector<int64_t> full_shape = shape;
  if (partition == TensorPartition::rows) full_shape[0] *= tensor_parallel_;
  if (partition == TensorPartition::columns) full_shape[1] *= tensor_parallel_;
  const int64_t full_offset = full_numel_;
  full_numel_ = common::checked_add(
      full_numel_,
      partition == TensorPartition::replicated
          ? numel
          : common::checked_multiply(numel, tensor_parallel_, name),
      name);
  if (!held) return kAbsentTensor;
  tensor_index_.emplace(name, tensors_.size());
  tensors_.push_back({std::move(name), std::move(shape), offset, numel, weight_decay, partition,
                      partition == TensorPartition::rows ? blocks : 1, std::move(full_shape),
                      full_offset});
  tensor_init_.push_back(init);
  return offset;
}

const ParameterTensor& ParameterLayout::tensor(const std::string& name) const {
  const auto found = tensor_index_.find(name);
  if (found == tensor_index_.end()) {
    const auto& t = tensors_;
    common::fail(
        "unknown parameter tensor '{}'; this model has {} tensors, e.g. {}, {}, {}, {}, "
        "decoder.layers.{{0..{}}}.mlp.linear_fc1.weight",
        name, t.size(), t[0].name, t[1].name, t[2].name, t.back().name, num_layers_ - 1);
  }
  return tensors_[found->second];
}

template <typename Scalar>
void ParameterLayout::init_parameters(Scalar* values, uint64_t seed) const {
  const uint64_t key = common::splitmix64_mix(seed);
  const double base_std = init_method_std_;
  const double scaled_std = base_std / std::sqrt(2.0 * static_cast<double>(num_layers_));
  for (size_t t = 0; t < tensors_.size(); ++t) {
    const ParameterTensor& tensor = tensors_[t];
    Scalar* tensor_values = values + tensor.offset;
    const ParameterInit init = tensor_init_[t];
    if (init == ParameterInit::zeros || init == ParameterInit::ones) {
      std::fill_n(tensor_values, tensor.numel,
                  static_cast<Scalar>(init == ParameterInit::ones ? 1 : 0));
      continue;
    }
    const double tensor_std = init == ParameterInit::scaled_normal ? scaled_std : base_std;
    // The values the whole tensor has at this shard's elements: element j of a piece is element
    // full_offset + piece.full_offset + j of the unsharded layout's stream.
    for (const ShardPiece& piece : shard_pieces(tensor, tensor_parallel_, tensor_parallel_rank_)) {
      const auto first = static_cast<uint64_t>(tensor.full_offset + piece.full_offset);
      Scalar* piece_values = tensor_values + piece.shard_offset;
      // Blocks at fixed offsets from the piece's start; the static schedule gives each thread
      // one contiguous range to first-touch (the buffer's pages are faulted in here).
      const int64_t blocks = (piece.numel + kNormalBlock - 1) / kNormalBlock;
#pragma omp parallel for schedule(static) if (piece.numel > (1 << 14))
      for (int64_t block = 0; block < blocks; ++block) {
        const int64_t begin = block * kNormalBlock;
        fill_normal_block(piece_values + begin, std::min(kNormalBlock, piece.numel - begin), key,
                          first + static_cast<uint64_t>(begin), tensor_std);
      }
    }
  }
}

template void ParameterLayout::init_parameters<float>(float*, uint64_t) const;
template void ParameterLayout::init_parameters<double>(double*, uint64_t) const;

}  // namespace backend
