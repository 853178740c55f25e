// build_tokenizer: Megatron's build_tokenizer for the tokenizer types we have, with the
// flag checks Megatron leaves to bare asserts.
#include "backend/data/tokenizer.hpp"

#include "backend/common/checked_math.hpp"
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

TokenizerFacts tokenizer_facts(const TokenizerOptions& tokenizer, bool mock_data) {
  // The tokenizer read from its files, with only the files its type takes.
  auto read = [&](std::string vocab_file, std::string merge_file, std::string tokenizer_model) {
    TokenizerOptions options = tokenizer;
    options.vocab_file = std::move(vocab_file);
    options.merge_file = std::move(merge_file);
    options.vocab_size = 0;
    options.tokenizer_model = std::move(tokenizer_model);
    const auto built = build_tokenizer(options);
    return TokenizerFacts{.vocab_size = built->vocab_size(), .end_of_document = built->eod()};
  };
  if (tokenizer.tokenizer_type == "GPT2BPETokenizer") {
    // With real data the vocabulary file decides. Mock data does not read the files (the
    // launcher's configs name NeMo's default paths, which need not exist), nor do the
    // checkpoint tools: GPT-2's size is a known fact.
    if (mock_data || (tokenizer.vocab_file.empty() && tokenizer.merge_file.empty())) {
      return {.vocab_size = kGpt2VocabSize, .end_of_document = kGpt2EndOfDocument};
    }
    return read(tokenizer.vocab_file, tokenizer.merge_file, "");
  }
  if (tokenizer.tokenizer_type == "NullTokenizer") {
    // Megatron's _NullTokenizer: ids 0 .. --vocab-size − 1, then the EOD (--vocab-size's rule
    // keeps it below 2^31 − 1).
    return {.vocab_size =
                common::checked_add(tokenizer.vocab_size, 1, "--vocab-size + NullTokenizer's EOD"),
            .end_of_document = static_cast<int32_t>(tokenizer.vocab_size)};
  }
  if (reads_tokenizer_model(tokenizer.tokenizer_type)) {
    // No size is known without the model (Llama 2's 32000 is one model's), so the file is
    // read even for mock data, as Megatron's build_tokenizer reads it.
    return read("", "", tokenizer.tokenizer_model);
  }
  common::fail(
      "--tokenizer-type '{}' is not valid (valid: GPT2BPETokenizer, NullTokenizer, "
      "SentencePieceTokenizer, GPTSentencePieceTokenizer, Llama2Tokenizer, "
      "HuggingFaceTokenizer)",
      tokenizer.tokenizer_type);
}

}  // namespace backend
