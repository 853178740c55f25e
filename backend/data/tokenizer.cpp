// build_tokenizer: Megatron's build_tokenizer for the tokenizer types we have, with the
// flag checks Megatron leaves to bare asserts.
#include "backend/data/tokenizer.hpp"

#include "backend/common/error.hpp"
#include "backend/data/gpt2_bpe_tokenizer.hpp"
#include "backend/data/hf_tokenizer.hpp"
#include "backend/data/null_tokenizer.hpp"
#include "backend/data/sentencepiece_tokenizer.hpp"

namespace backend {

bool is_sentencepiece_type(std::string_view tokenizer_type) {
  return sentencepiece_kind(tokenizer_type).has_value();
}

bool reads_tokenizer_model(std::string_view tokenizer_type) {
  return is_sentencepiece_type(tokenizer_type) || tokenizer_type == "HuggingFaceTokenizer";
}

void check_tokenizer_flags(const TokenizerOptions& options) {
  if (options.tokenizer_type == "HuggingFaceTokenizer" && options.tokenizer_model.empty()) {
    common::fail("--tokenizer-type HuggingFaceTokenizer needs --tokenizer-model (the directory "
                 "holding tokenizer.json, e.g. Llama 3's, or the tokenizer.json file)");
  }
  if (is_sentencepiece_type(options.tokenizer_type)) {
    if (options.tokenizer_model.empty()) {
      common::fail("--tokenizer-type {} needs --tokenizer-model (the SentencePiece model file, "
                   "e.g. Llama's tokenizer.model)", options.tokenizer_type);
    }
  } else if (!options.tokenizer_model.empty() &&
             options.tokenizer_type != "HuggingFaceTokenizer") {
    // Megatron ignores a model file that its tokenizer does not read; a Llama script whose
    // --tokenizer-type was changed by mistake would then train on another vocabulary, silently.
    common::fail("--tokenizer-model {} is read only by the SentencePiece and HuggingFace "
                 "tokenizers (valid --tokenizer-type: SentencePieceTokenizer, "
                 "GPTSentencePieceTokenizer, Llama2Tokenizer, HuggingFaceTokenizer), not by "
                 "--tokenizer-type {}", options.tokenizer_model,
                 options.tokenizer_type.empty() ? "''" : options.tokenizer_type);
  }
  if (options.vocab_extra_ids != 0 && options.tokenizer_type != "SentencePieceTokenizer") {
    common::fail("--vocab-extra-ids {} is not supported with --tokenizer-type {}: only "
                 "SentencePieceTokenizer adds extra ids here (T5/BERT tokenizers are not built)",
                 options.vocab_extra_ids,
                 options.tokenizer_type.empty() ? "''" : options.tokenizer_type);
  }
}

std::unique_ptr<Tokenizer> build_tokenizer(const TokenizerOptions& options) {
  check_tokenizer_flags(options);
  if (const auto kind = sentencepiece_kind(options.tokenizer_type)) {
    return std::make_unique<SentencePieceTokenizer>(*kind, options.tokenizer_model,
                                                    options.vocab_extra_ids);
  }
  if (options.tokenizer_type == "GPT2BPETokenizer") {
    if (options.vocab_file.empty() || options.merge_file.empty()) {
      common::fail("--tokenizer-type GPT2BPETokenizer needs --vocab-file (GPT-2's vocab.json) "
                   "and --merge-file (GPT-2's merges.txt)");
    }
    return std::make_unique<Gpt2BpeTokenizer>(options.vocab_file, options.merge_file);
  }
  if (options.tokenizer_type == "HuggingFaceTokenizer") {
    return std::make_unique<HuggingFaceTokenizer>(options.tokenizer_model);
  }
  if (options.tokenizer_type == "NullTokenizer") {
    if (options.vocab_size <= 0) {
      common::fail("--tokenizer-type NullTokenizer needs --vocab-size N (N > 0)");
    }
    return std::make_unique<NullTokenizer>(options.vocab_size);
  }
  common::fail("--tokenizer-type {} is not available (valid: GPT2BPETokenizer, NullTokenizer, "
               "SentencePieceTokenizer, GPTSentencePieceTokenizer, Llama2Tokenizer, "
               "HuggingFaceTokenizer; BERT and tiktoken tokenizers are not built)",
               options.tokenizer_type.empty() ? "''" : options.tokenizer_type);
}

}  // namespace backend
