// GPT-2's byte-level BPE tokenizer (Radford et al. 2019, section 2.2), Megatron's
// GPT2BPETokenizer (megatron/training/tokenizer/gpt2_tokenization.py, itself OpenAI's gpt-2
// src/encoder.py), from GPT-2's vocab.json and merges.txt. Encoding text:
//  1. Invalid UTF-8 is replaced first, each maximal ill-formed subsequence by U+FFFD, as
//     Python's bytes.decode("utf-8", "replace") would (unicode_text.hpp). Megatron receives
//     Python strings and never sees such bytes; this is the one policy that gives the
//     reference's ids for the text a Python reader would have made.
//  2. Pre-tokenization splits the text as OpenAI's pattern does under Python's `regex` module:
//       's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//     written as a scanner over UTF-8 (no regular expression engine). The contractions are
//     lowercase ASCII only; \s is Unicode White_Space (unicode_text.hpp); a run of whitespace
//     followed by a non-space leaves its last character to start the next piece.
//  3. Each piece's bytes map to their single-byte tokens, and the lowest-ranked adjacent pair
//     in merges.txt is merged, every occurrence left to right, until no pair has a rank
//     (the original algorithm; a heap-driven version of the same passes for long pieces).
// Steps 2 and 3 are the byte-level BPE shared with HuggingFaceTokenizer (byte_level_bpe.hpp,
// pattern `gpt2`, without ignore_merges), word cache included.
// Ids are the vocab.json values; "<|endoftext|>" (50256 in GPT-2) is eod() and is never
// produced from text: the string "<|endoftext|>" in a document is ordinary text, as in
// Megatron (GPT2Tokenizer with no special tokens).
//
// Loading checks the files and reports the file and line at fault (bad JSON, a merge line that
// is not two tokens, a token missing from the vocabulary).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "backend/data/byte_level_bpe.hpp"
#include "backend/data/tokenizer.hpp"

namespace backend {

// GPT-2's vocabulary: 256 byte tokens, 50,000 merges and <|endoftext|>.
inline constexpr int64_t kGpt2VocabSize = 50257;
inline constexpr int32_t kGpt2EndOfDocument = 50256;  // "<|endoftext|>"

using Gpt2BpeOptions = ByteLevelBpeOptions;

class Gpt2BpeTokenizer final : public Tokenizer {
 public:
  Gpt2BpeTokenizer(const std::filesystem::path& vocab_file,
                   const std::filesystem::path& merge_file, Gpt2BpeOptions options = {});
  ~Gpt2BpeTokenizer() override;
  Gpt2BpeTokenizer(const Gpt2BpeTokenizer& other);
  Gpt2BpeTokenizer& operator=(const Gpt2BpeTokenizer&) = delete;

  int64_t vocab_size() const override;
  int32_t eod() const override;
  using Tokenizer::tokenize;
  void tokenize(std::string_view text, std::vector<int32_t>& ids) override;
  std::string detokenize(std::span<const int32_t> ids) const override;
  std::unique_ptr<Tokenizer> clone() const override;

  // The pre-tokenization pieces of `text` (valid UTF-8), for tests and diagnostics.
  std::vector<std::string_view> pretokenize(std::string_view text) const;

 private:
  int32_t eod_ = 0;
  std::shared_ptr<const ByteLevelBpeTables> tables_;
  ByteLevelBpeEncoder encoder_;
  std::string repaired_text_;  // scratch: the text with invalid UTF-8 replaced
};

}  // namespace backend
