// build_tokenizer: Megatron's build_tokenizer for the tokenizer types we have, with the
// flag checks Megatron leaves to bare asserts.
#include "backend/data/tokenizer.hpp"

#include "backend/common/error.hpp"
#include "backend/data/gpt2_bpe_tokenizer.hpp"
#include "backend/data/null_tokenizer.hpp"

namespace backend {

std::unique_ptr<Tokenizer> build_tokenizer(const TokenizerOptions& options) {
  if (options.tokenizer_type == "GPT2BPETokenizer") {
    if (options.vocab_file.empty() || options.merge_file.empty()) {
      common::fail("--tokenizer-type GPT2BPETokenizer needs --vocab-file (GPT-2's vocab.json) "
                   "and --merge-file (GPT-2's merges.txt)");
    }
    return std::make_unique<Gpt2BpeTokenizer>(options.vocab_file, options.merge_file);
  }
  if (options.tokenizer_type == "NullTokenizer") {
    if (options.vocab_size <= 0) {
      common::fail("--tokenizer-type NullTokenizer needs --vocab-size N (N > 0)");
    }
    return std::make_unique<NullTokenizer>(options.vocab_size);
  }
  common::fail("--tokenizer-type {} is not available (valid: GPT2BPETokenizer, NullTokenizer; "
               "SentencePiece and HuggingFace tokenizers are not built)",
               options.tokenizer_type.empty() ? "''" : options.tokenizer_type);
}

}  // namespace backend
