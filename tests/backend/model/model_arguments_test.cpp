// The model's flags and the model they describe: gpt_config turns the flags into a validated
// GptConfig (Megatron's padding, GQA only with --group-query-attention, recompute settings only
// with full recompute), and model_arguments gives flags that describe a config back.
#include "backend/model/model_arguments.hpp"

#include <doctest/doctest.h>

#include "backend/common/error.hpp"

namespace {

backend::ModelArguments llama_flags() {
  backend::ModelArguments model;
  model.num_layers = 2;
  model.hidden_size = 64;
  model.ffn_hidden_size = 96;
  model.num_attention_heads = 4;
  model.seq_length = 16;
  model.max_position_embeddings = 16;
  model.position_embedding_type = backend::PositionEmbeddingType::rope;
  model.use_rope_scaling = true;
  model.rope_scaling_factor = 4.0;
  model.normalization = backend::Normalization::rms_norm;
  model.swiglu = true;
  model.add_bias_linear = false;
  model.untie_embeddings_and_output_weights = true;
  model.group_query_attention = true;
  model.num_query_groups = 2;
  model.hidden_dropout = model.attention_dropout = 0.0;
  return model;
}

}  // namespace

TEST_CASE("model arguments: the flags give the model, and the model gives its flags back") {
  const backend::ModelArguments flags = llama_flags();
  const backend::GptConfig config = backend::gpt_config(flags, 1000, 2);
  CHECK(config.padded_vocab_size == 1024);  // a multiple of 128 × tp 2
  CHECK(config.num_query_groups == 2);
  CHECK(config.position_embedding_type == backend::PositionEmbeddingType::rope);
  CHECK(config.rope_scaling.factor == 4.0);
  CHECK(config.normalization == backend::Normalization::rms_norm);
  CHECK_FALSE(config.share_embeddings_and_output_weights);
  CHECK(config.recompute_granularity == backend::RecomputeGranularity::none);

  const backend::ModelArguments back = backend::model_arguments(config);
  CHECK(back.num_layers == flags.num_layers);
  CHECK(back.ffn_hidden_size == flags.ffn_hidden_size);
  CHECK(back.position_embedding_type == flags.position_embedding_type);
  CHECK(back.normalization == flags.normalization);
  CHECK(back.use_rope_scaling);
  CHECK(back.rope_scaling_factor == 4.0);
  CHECK(back.num_query_groups == 2);
  CHECK(back.make_vocab_size_divisible_by == 128);  // 1000 → 1024 also at 128, the largest
  const backend::GptConfig again = backend::gpt_config(back, config.vocab_size, 2);
  CHECK(again.padded_vocab_size == config.padded_vocab_size);
  CHECK(again.qkv_features() == config.qkv_features());
}

TEST_CASE("model arguments: query groups and recompute settings count only where they apply") {
  backend::ModelArguments flags = llama_flags();
  flags.group_query_attention = false;  // --num-query-groups alone is Megatron's unread default
  CHECK(backend::gpt_config(flags, 1000, 1).num_query_groups == 0);

  flags.recompute_method = backend::RecomputeMethod::block;
  flags.recompute_num_layers = 1;
  flags.recompute_granularity = backend::RecomputeGranularity::selective;
  const backend::GptConfig selective = backend::gpt_config(flags, 1000, 1);
  CHECK(selective.recompute_granularity == backend::RecomputeGranularity::selective);
  CHECK(selective.recompute_method == backend::RecomputeMethod::uniform);  // the default kept
  flags.recompute_granularity = backend::RecomputeGranularity::full;
  const backend::GptConfig full = backend::gpt_config(flags, 1000, 1);
  CHECK(full.recompute_method == backend::RecomputeMethod::block);
  CHECK(full.recompute_num_layers == 1);
  flags.recompute_method.reset();
  flags.recompute_num_layers.reset();
  CHECK(backend::gpt_config(flags, 1000, 1).recompute_num_layers == 1);

  // An inconsistent shape is validate()'s error, naming the flag.
  flags.num_attention_heads = 3;
  CHECK_THROWS_AS(backend::gpt_config(flags, 1000, 1), common::Error);
}

TEST_CASE("model arguments: RoPE scaling that no flag describes is refused by name") {
  backend::GptConfig config = backend::gpt_config(llama_flags(), 1000, 1);
  config.rope_scaling.low_frequency_factor = 2.0;
  CHECK_THROWS_WITH_AS(backend::model_arguments(config),
                       doctest::Contains("has no pretrain_gpt flags"), common::Error);
}
