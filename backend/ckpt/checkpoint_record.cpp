// The model's record in a checkpoint's metadata; see checkpoint_record.hpp.
#include "backend/ckpt/checkpoint_record.hpp"

namespace backend {

namespace {

using nlohmann::json;

const RecordedArgument<ModelArguments> kRecordedModelArguments[] = {
    {"num_layers", &ModelArguments::num_layers},
    {"hidden_size", &ModelArguments::hidden_size},
    {"ffn_hidden_size", &ModelArguments::ffn_hidden_size},
    {"num_attention_heads", &ModelArguments::num_attention_heads},
    {"seq_length", &ModelArguments::seq_length},
    {"max_position_embeddings", &ModelArguments::max_position_embeddings},
    {"make_vocab_size_divisible_by", &ModelArguments::make_vocab_size_divisible_by},
    {"init_method_std", &ModelArguments::init_method_std},
    {"norm_epsilon", &ModelArguments::norm_epsilon},
    {"position_embedding_type",
     common::enum_flag_field<&ModelArguments::position_embedding_type>()},
    {"rotary_base", &ModelArguments::rotary_base},
    {"rotary_percent", &ModelArguments::rotary_percent},
    {"use_rope_scaling", &ModelArguments::use_rope_scaling, kOptionalRecord},
    {"rope_scaling_factor", &ModelArguments::rope_scaling_factor, kOptionalRecord},
    {"normalization", common::enum_flag_field<&ModelArguments::normalization>()},
    {"apply_layernorm_1p", &ModelArguments::apply_layernorm_1p, kOptionalRecord},
    {"swiglu", &ModelArguments::swiglu},
    {"untie_embeddings_and_output_weights", &ModelArguments::untie_embeddings_and_output_weights},
    {"hidden_dropout", &ModelArguments::hidden_dropout},
    {"attention_dropout", &ModelArguments::attention_dropout},
};
const RecordedArgument<TokenizerOptions> kRecordedTokenizerArguments[] = {
    {"tokenizer_type", &TokenizerOptions::tokenizer_type},
    {"tokenizer_model", &TokenizerOptions::tokenizer_model, kOptionalRecord},
    {"vocab_size", &TokenizerOptions::vocab_size},
};
const RecordedArgument<ParallelismArguments> kRecordedParallelismArguments[] = {
    {"tensor_model_parallel_size", &ParallelismArguments::tensor_model_parallel_size},
    {"pipeline_model_parallel_size", &ParallelismArguments::pipeline_model_parallel_size},
    {"num_layers_per_virtual_pipeline_stage",
     &ParallelismArguments::num_layers_per_virtual_pipeline_stage, kOptionalRecord},
};

}  // namespace

void record_model(const CheckpointModelRecord& record, json& arguments) {
  record_arguments<ModelArguments>(record.model, kRecordedModelArguments, arguments);
  record_arguments<TokenizerOptions>(record.tokenizer, kRecordedTokenizerArguments, arguments);
  record_arguments<ParallelismArguments>(record.parallelism, kRecordedParallelismArguments,
                                         arguments);
  arguments["disable_bias_linear"] = !record.model.add_bias_linear;
  arguments["num_query_groups"] =
      record.model.group_query_attention ? record.model.num_query_groups : 0;
}

CheckpointModelRecord read_model_record(const CheckpointMetadata& metadata,
                                        const std::filesystem::path& file) {
  const json& saved = metadata.section("arguments");
  CheckpointModelRecord record;
  read_recorded_arguments<ModelArguments>(metadata, saved, file, kRecordedModelArguments,
                                          record.model);
  read_recorded_arguments<TokenizerOptions>(metadata, saved, file, kRecordedTokenizerArguments,
                                            record.tokenizer);
  read_recorded_arguments<ParallelismArguments>(metadata, saved, file,
                                                kRecordedParallelismArguments, record.parallelism);
  record.model.add_bias_linear = !metadata.get<bool>(saved, "disable_bias_linear");
  const auto num_query_groups = metadata.get<int64_t>(saved, "num_query_groups");
  record.model.group_query_attention = num_query_groups > 0;
  if (record.model.group_query_attention) record.model.num_query_groups = num_query_groups;
  return record;
}

CheckpointModelRecord read_saved_model_record(const std::filesystem::path& directory,
                                              std::string_view option, std::string_view remedy) {
  const TrackedCheckpoint tracked = require_checkpoint(directory, option, remedy);
  const CheckpointFileReader reader(tracked.file);
  return read_model_record(CheckpointMetadata(reader.metadata(), reader.path()), reader.path());
}

GptConfig model_config(const CheckpointModelRecord& record) {
  return gpt_config(record.model, tokenizer_facts(record.tokenizer).vocab_size,
                    record.parallelism.tensor_model_parallel_size);
}

}  // namespace backend
