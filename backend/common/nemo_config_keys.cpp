// NeMo config settings for pretrain_gpt's shape flags; see nemo_config_keys.hpp. The values are
// NeMo's spellings of what the launcher translates (RMSNorm ← rmsnorm, --swiglu ← activation
// swiglu, --disable-bias-linear ← bias false).
#include "backend/common/nemo_config_keys.hpp"

#include <fmt/format.h>

#include "backend/common/ascii_case.hpp"

namespace common {

namespace {

struct NemoDirectKey {
  std::string_view flag;
  std::string_view key;  // below training.
};

// Flags whose value is the key's, as it is.
constexpr NemoDirectKey kNemoDirectKeys[] = {
    {"--num-layers", "model.num_layers"},
    {"--hidden-size", "model.hidden_size"},
    {"--ffn-hidden-size", "model.ffn_hidden_size"},
    {"--num-attention-heads", "model.num_attention_heads"},
    {"--seq-length", "model.encoder_seq_length"},
    {"--max-position-embeddings", "model.max_position_embeddings"},
    {"--make-vocab-size-divisible-by", "model.make_vocab_size_divisible_by"},
    {"--tensor-model-parallel-size", "model.tensor_model_parallel_size"},
    {"--pipeline-model-parallel-size", "model.pipeline_model_parallel_size"},
    {"--num-query-groups", "model.num_query_groups"},
    {"--group-query-attention --num-query-groups", "model.num_query_groups"},
    {"--position-embedding-type", "model.position_embedding_type"},
};

bool switch_is_on(std::string_view value) { return value == "true" || value == "True"; }

}  // namespace

std::string nemo_settings_for_flag(std::string_view flag, std::string_view value) {
  for (const NemoDirectKey& row : kNemoDirectKeys) {
    if (row.flag == flag) return fmt::format("training.{}={}", row.key, value);
  }
  if (flag == "--tokenizer-type") {
    // The launcher passes the type of library megatron or sentencepiece as it is; NeMo's
    // SentencePiece models are library sentencepiece, a Hugging Face one the directory.
    if (value == "HuggingFaceTokenizer") {
      return "training.model.tokenizer.library=huggingface "
             "training.model.tokenizer.type=<the directory of its tokenizer.json>";
    }
    const bool sentencepiece = value == "Llama2Tokenizer" || value == "GPTSentencePieceTokenizer" ||
                               value == "SentencePieceTokenizer";
    return fmt::format("training.model.tokenizer.library={} training.model.tokenizer.type={}",
                       sentencepiece ? "sentencepiece" : "megatron", value);
  }
  if (flag == "--normalization") {
    return fmt::format("training.model.normalization={}", ascii_lowercase(std::string(value)));
  }
  if (flag == "--swiglu") {
    return fmt::format("training.model.activation={}", switch_is_on(value) ? "swiglu" : "gelu");
  }
  if (flag == "--disable-bias-linear") {
    return fmt::format("training.model.bias={}", switch_is_on(value) ? "false" : "true");
  }
  if (flag == "--untie-embeddings-and-output-weights") {
    return fmt::format("training.model.share_embeddings_and_output_weights={}",
                       switch_is_on(value) ? "false" : "true");
  }
  return "";
}

}  // namespace common
