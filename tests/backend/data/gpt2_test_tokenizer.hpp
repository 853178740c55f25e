// Test support: GPT-2's BPE tokenizer from the vocabulary and merges in tests/data/, built as
// pretrain_gpt builds it (--tokenizer-type GPT2BPETokenizer).
#pragma once

#include <memory>

#include "backend/data/tokenizer.hpp"
#include "test_files.hpp"

namespace test_support {

inline std::unique_ptr<backend::Tokenizer> gpt2_tokenizer() {
  return backend::build_tokenizer({.tokenizer_type = "GPT2BPETokenizer",
                                   .vocab_file = kGpt2Vocab,
                                   .merge_file = kGpt2Merges,
                                   .vocab_size = 0,
                                   .tokenizer_model = ""});
}

}  // namespace test_support
