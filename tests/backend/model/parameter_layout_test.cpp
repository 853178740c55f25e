// The tensor-parallel parameter layout (parameter_layout.hpp): which tensors each rank holds a
// shard of and where the shard's elements sit in the whole tensor, that the shards of every
// rank tile the whole layout exactly once, that a shard is initialised with the whole tensor's
// values, and which ranges count towards the global gradient norm.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "backend/common/error.hpp"
#include "backend/model/parameter_layout.hpp"

using backend::GptConfig;
using backend::ParameterLayout;
using backend::TensorPartition;

namespace {

GptConfig llama_style(int64_t tensor_parallel) {
  GptConfig config;
  config.num_layers = 2;
  config.hidden_size = 32;
  config.num_attention_heads = 8;
  config.num_query_groups = 4;
  config.ffn_hidden_size = 24;
  config.max_position_embeddings = 16;
  config.vocab_size = 50;
  config.padded_vocab_size = backend::padded_vocab_size(50, 4, tensor_parallel);
  config.swiglu = true;
  config.share_embeddings_and_output_weights = false;
  return config;
}

}  // namespace

TEST_CASE("each tensor is split as Megatron splits it, with the shard's shape") {
  const GptConfig config = llama_style(2);  // padded vocabulary 56
  const ParameterLayout whole(config);
  const ParameterLayout shard(config, 2, 1);
  CHECK(shard.tensor_parallel() == 2);
  CHECK(shard.tensor_parallel_rank() == 1);
  REQUIRE(shard.tensors().size() == whole.tensors().size());
  const auto& qkv = shard.tensor("decoder.layers.0.self_attention.linear_qkv.weight");
  CHECK(qkv.partition == TensorPartition::rows);
  CHECK(qkv.shape == std::vector<int64_t>{(4 + 2 * 2) * 4, 32});  // NH/2 + 2·NG/2 heads of 4
  CHECK(qkv.full_shape == std::vector<int64_t>{(8 + 2 * 4) * 4, 32});
  const auto& proj = shard.tensor("decoder.layers.0.self_attention.linear_proj.weight");
  CHECK(proj.partition == TensorPartition::columns);
  CHECK(proj.shape == std::vector<int64_t>{32, 16});
  const auto& fc1 = shard.tensor("decoder.layers.1.mlp.linear_fc1.weight");
  CHECK(fc1.partition_blocks == 2);
  CHECK(fc1.shape == std::vector<int64_t>{24, 32});
  CHECK(shard.tensor("decoder.layers.1.mlp.linear_fc2.weight").shape == std::vector<int64_t>{32, 12});
  CHECK(shard.tensor("embedding.word_embeddings.weight").shape == std::vector<int64_t>{28, 32});
  CHECK(shard.tensor("output_layer.weight").partition == TensorPartition::rows);
  CHECK(shard.tensor("decoder.final_layernorm.weight").partition == TensorPartition::replicated);
  CHECK(shard.tensor("decoder.layers.0.self_attention.linear_proj.bias").partition ==
        TensorPartition::replicated);
  for (size_t t = 0; t < whole.tensors().size(); ++t) {
    CHECK(shard.tensors()[t].full_offset == whole.tensors()[t].offset);
    CHECK(shard.tensors()[t].full_shape == whole.tensors()[t].shape);
  }
}

TEST_CASE("SwiGLU's linear_fc1 shard is [gate_r | linear_r] — a column shard is each row's segment") {
  const GptConfig config = llama_style(2);
  const ParameterLayout shard(config, 2, 1);
  const auto& fc1 = shard.tensor("decoder.layers.0.mlp.linear_fc1.weight");  // whole (48, 32)
  const auto pieces = backend::shard_pieces(fc1, 2, 1);
  REQUIRE(pieces.size() == 2);
  CHECK(pieces[0].full_offset == 12 * 32);       // gate rows 12..23
  CHECK(pieces[0].shard_offset == 0);
  CHECK(pieces[1].full_offset == (24 + 12) * 32);  // linear rows 36..47
  CHECK(pieces[1].shard_offset == 12 * 32);
  CHECK(pieces[1].numel == 12 * 32);
  const auto& fc2 = shard.tensor("decoder.layers.0.mlp.linear_fc2.weight");  // whole (32, 24)
  const auto columns = backend::shard_pieces(fc2, 2, 1);
  REQUIRE(columns.size() == 32);
  CHECK(columns[3].full_offset == 3 * 24 + 12);
  CHECK(columns[3].shard_offset == 3 * 12);
  CHECK(columns[3].numel == 12);
}

TEST_CASE("the shards of every rank tile each tensor once, and carry the whole tensor's values") {
  for (const int64_t tp : {2, 4}) {
    CAPTURE(tp);
    const GptConfig config = llama_style(tp);
    const ParameterLayout whole(config);
    std::vector<double> whole_values(static_cast<size_t>(whole.numel()));
    whole.init_parameters(whole_values.data(), 5);
    for (size_t t = 0; t < whole.tensors().size(); ++t) {
      const auto& tensor = whole.tensors()[t];
      std::vector<int> covered(static_cast<size_t>(tensor.numel), 0);
      for (int64_t rank = 0; rank < tp; ++rank) {
        const ParameterLayout shard(config, tp, rank);
        const auto& part = shard.tensors()[t];
        std::vector<double> values(static_cast<size_t>(shard.numel()));
        shard.init_parameters(values.data(), 5);
        int64_t shard_elements = 0;
        for (const auto& piece : backend::shard_pieces(part, tp, rank)) {
          shard_elements += piece.numel;
          for (int64_t i = 0; i < piece.numel; ++i) {
            ++covered[static_cast<size_t>(piece.full_offset + i)];
            REQUIRE(values[static_cast<size_t>(part.offset + piece.shard_offset + i)] ==
                    whole_values[static_cast<size_t>(tensor.offset + piece.full_offset + i)]);
          }
        }
        CHECK(shard_elements == part.numel);
      }
      const bool replicated =
          ParameterLayout(config, tp, 0).tensors()[t].partition == TensorPartition::replicated;
      const int expected = replicated ? static_cast<int>(tp) : 1;
      CAPTURE(tensor.name);
      CHECK(std::count(covered.begin(), covered.end(), expected) == tensor.numel);
    }
  }
}

TEST_CASE("a shard's boxes hold the elements its pieces place, each where the pieces put it") {
  for (const int64_t tp : {1, 2, 4}) {
    CAPTURE(tp);
    const GptConfig config = llama_style(tp);
    for (int64_t rank = 0; rank < tp; ++rank) {
      const ParameterLayout shard(config, tp, rank);
      for (const auto& part : shard.tensors()) {
        CAPTURE(part.name);
        // The whole-tensor offset of each shard element, by the pieces and by the boxes.
        std::vector<int64_t> by_pieces(static_cast<size_t>(part.numel), -1);
        for (const auto& piece : backend::shard_pieces(part, tp, rank)) {
          for (int64_t i = 0; i < piece.numel; ++i) {
            by_pieces[static_cast<size_t>(piece.shard_offset + i)] = piece.full_offset + i;
          }
        }
        std::vector<int64_t> by_boxes(static_cast<size_t>(part.numel), -1);
        const std::vector<int64_t>& full = part.full_shape;
        for (const auto& box : backend::shard_boxes(part, rank)) {
          REQUIRE(box.offsets.size() == full.size());
          int64_t count = 1;
          for (const int64_t size : box.sizes) count *= size;
          for (int64_t i = 0; i < count; ++i) {
            // Box element i (row-major in the box) at its place in the whole tensor.
            int64_t rest = i, full_offset = 0, stride = 1;
            for (auto axis = static_cast<int64_t>(full.size()) - 1; axis >= 0; --axis) {
              const auto a = static_cast<size_t>(axis);
              full_offset += (box.offsets[a] + rest % box.sizes[a]) * stride;
              rest /= box.sizes[a];
              stride *= full[a];
            }
            by_boxes[static_cast<size_t>(box.shard_offset + i)] = full_offset;
          }
        }
        CHECK(by_boxes == by_pieces);
      }
    }
  }
}

TEST_CASE("the gradient norm counts divided tensors on every rank, whole ones on rank 0") {
  const GptConfig config = llama_style(2);
  const ParameterLayout rank0(config, 2, 0), rank1(config, 2, 1);
  int64_t counted0 = 0, counted1 = 0;
  for (const auto& range : backend::gradient_norm_ranges(rank0.tensors(), 0)) counted0 += range.numel;
  for (const auto& range : backend::gradient_norm_ranges(rank1.tensors(), 1)) counted1 += range.numel;
  CHECK(counted0 == rank0.numel());
  int64_t divided = 0;
  for (const auto& tensor : rank1.tensors()) {
    if (tensor.partition != TensorPartition::replicated) divided += tensor.numel;
  }
  CHECK(counted1 == divided);
  CHECK(counted0 + counted1 == ParameterLayout(config).numel());
}

TEST_CASE("tensor-parallel sizes that do not divide the shape are refused, naming the flag") {
  GptConfig config = llama_style(2);
  CHECK_THROWS_WITH_AS(ParameterLayout(config, 3, 0),
                       doctest::Contains("--num-attention-heads (8) must be divisible by "
                                         "--tensor-model-parallel-size (3)"),
                       common::Error);
  config.ffn_hidden_size = 25;
  CHECK_THROWS_WITH_AS(ParameterLayout(config, 2, 0), doctest::Contains("--ffn-hidden-size (25)"),
                       common::Error);
  config = llama_style(1);  // padded to 52: not a multiple of 8
  CHECK_THROWS_WITH_AS(ParameterLayout(config, 8, 0), doctest::Contains("must be divisible"),
                       common::Error);
}

TEST_CASE("a pipeline stage holds its chunks' layers, the first the embedding, the last the head") {
  GptConfig config = llama_style(1);
  config.num_layers = 8;
  config.share_embeddings_and_output_weights = true;
  const ParameterLayout whole(config);
  std::vector<float> whole_values(static_cast<size_t>(whole.numel()));
  whole.init_parameters(whole_values.data(), 7);
  // Four stages of two chunks of one layer: stage r holds layers r and 4 + r (Megatron's
  // interleaved assignment).
  int64_t counted = 0;
  for (int64_t rank = 0; rank < 4; ++rank) {
    CAPTURE(rank);
    const backend::PipelineStage stage{.pipeline_parallel = 4, .rank = rank, .virtual_chunks = 2};
    const ParameterLayout layout(config, 1, 0, stage);
    CHECK(layout.chunks() == std::vector<backend::LayerRange>{{rank, rank + 1}, {4 + rank, 5 + rank}});
    CHECK((layout.word_embeddings() != backend::kAbsentTensor) == (rank == 0));
    CHECK((layout.final_norm_weight() != backend::kAbsentTensor) == (rank == 3));
    CHECK((layout.output_weight() != backend::kAbsentTensor) == (rank == 3));
    for (int64_t l = 0; l < 8; ++l) {
      const bool held = l == rank || l == 4 + rank;
      CHECK((layout.layer(l).fc1_weight != backend::kAbsentTensor) == held);
    }
    std::vector<float> values(static_cast<size_t>(layout.numel()));
    layout.init_parameters(values.data(), 7);
    for (const auto& tensor : layout.tensors()) {
      CAPTURE(tensor.name);
      // The tied copy is output_layer.weight on the last stage, with the word embedding's values.
      CHECK(tensor.tied_copy == (rank == 3 && tensor.name == "output_layer.weight"));
      const auto& reference =
          whole.tensor(tensor.tied_copy ? "embedding.word_embeddings.weight" : tensor.name);
      CHECK(std::equal(values.begin() + tensor.offset,
                       values.begin() + tensor.offset + tensor.numel,
                       whole_values.begin() + reference.offset));
      if (!tensor.tied_copy) counted += tensor.numel;
    }
    // The tied copy never counts towards the gradient norm.
    int64_t norm_elements = 0;
    for (const auto& range : backend::gradient_norm_ranges(layout.tensors(), 0)) {
      norm_elements += range.numel;
    }
    CHECK(norm_elements == layout.numel() - (rank == 3 ? config.padded_vocab_size * 32 : 0));
  }
  CHECK(counted == whole.numel());  // the stages tile the model once
}

TEST_CASE("Megatron's pipeline rules are errors naming the flags") {
  GptConfig config = llama_style(1);
  config.num_layers = 6;
  CHECK_THROWS_WITH_AS(ParameterLayout(config, 1, 0, {.pipeline_parallel = 4, .rank = 0, .virtual_chunks = 1}),
                       doctest::Contains("--num-layers 6 must be divisible by "
                                         "--pipeline-model-parallel-size 4"),
                       common::Error);
  CHECK_THROWS_WITH_AS(
      ParameterLayout(config, 1, 0, {.pipeline_parallel = 2, .rank = 0, .virtual_chunks = 2}),
      doctest::Contains("the 3 layers per pipeline stage"), common::Error);
  CHECK_THROWS_WITH_AS(ParameterLayout(config, 1, 0, {.pipeline_parallel = 2, .rank = 2, .virtual_chunks = 1}),
                       doctest::Contains("pipeline-parallel rank 2 is outside [0, 2)"),
                       common::Error);
}
