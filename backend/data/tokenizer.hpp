// The tokenizer interface shared by preprocessing, training and generation, after Megatron's
// MegatronTokenizer (megatron/core/datasets/megatron_tokenizer.py): a vocabulary size, the
// end-of-document id that separates documents, text → ids and ids → text. The kinds built:
//   GPT2BPETokenizer  GPT-2's byte-level BPE (gpt2_bpe_tokenizer.hpp)
//   NullTokenizer     ids written as integers in the text, for tests and --vocab-size runs
//                     (null_tokenizer.hpp)
//   SentencePieceTokenizer, GPTSentencePieceTokenizer, Llama2Tokenizer
//                     a SentencePiece model (--tokenizer-model) through libsentencepiece
//                     (sentencepiece_tokenizer.hpp)
//   HuggingFaceTokenizer  a byte-level BPE tokenizer.json (--tokenizer-model: its directory),
//                     GPT-2's or Llama 3's kind (hf_tokenizer.hpp)
// BERT and tiktoken tokenizers, and HuggingFace files of other kinds (WordPiece, Unigram, other
// pre-tokenizer patterns), are not built (docs/data.md).
//
// Texts are bytes: tokenize() accepts any byte string (a GPT-2 tokenizer replaces invalid
// UTF-8, see gpt2_bpe_tokenizer.hpp), detokenize() returns the bytes the ids stand for, which
// need not be valid UTF-8 when the ids split a character.
//
// A tokenizer keeps caches and scratch buffers, so tokenize() is not const and one instance
// serves one thread; clone() gives another thread its own instance sharing the read-only
// vocabulary tables.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace backend {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Number of ids (Megatron's tokenizer.vocab_size, before padding for the embedding).
  virtual int64_t vocab_size() const = 0;
  // The end-of-document id appended by preprocess_data --append-eod.
  virtual int32_t eod() const = 0;

  // Appends the ids of `text` to `ids`.
  virtual void tokenize(std::string_view text, std::vector<int32_t>& ids) = 0;
  std::vector<int32_t> tokenize(std::string_view text) {
    std::vector<int32_t> ids;
    tokenize(text, ids);
    return ids;
  }

  // The bytes the ids stand for; an id outside [0, vocab_size) is an error.
  virtual std::string detokenize(std::span<const int32_t> ids) const = 0;

  // A fresh instance for another thread; read-only tables are shared, caches are not.
  virtual std::unique_ptr<Tokenizer> clone() const = 0;
};

// What Megatron's build_tokenizer reads from the command line.
struct TokenizerOptions {
  std::string tokenizer_type;   // --tokenizer-type: one of the kinds above
  std::string vocab_file;       // --vocab-file (GPT-2's vocab.json)
  std::string merge_file;       // --merge-file (GPT-2's merges.txt)
  int64_t vocab_size = 0;       // --vocab-size (NullTokenizer: ids 0 .. vocab_size, eod last)
  std::string tokenizer_model;  // --tokenizer-model (a SentencePiece model file, or the
                                // directory of a HuggingFace tokenizer.json)
  int64_t vocab_extra_ids = 0;  // --vocab-extra-ids (SentencePieceTokenizer's <extra_id_N>)
};

// True for the types read from --tokenizer-model: SentencePieceTokenizer,
// GPTSentencePieceTokenizer, Llama2Tokenizer.
bool is_sentencepiece_type(std::string_view tokenizer_type);

// True for the types that read --tokenizer-model: the SentencePiece ones and
// HuggingFaceTokenizer.
bool reads_tokenizer_model(std::string_view tokenizer_type);

// The flags a type needs or refuses, checked without reading a file: a type that reads
// --tokenizer-model needs it, another type refuses it, and --vocab-extra-ids needs
// SentencePieceTokenizer. A common::Error names the flags.
void check_tokenizer_flags(const TokenizerOptions& options);

// Builds the tokenizer the options name; missing or bad inputs are common::Error naming
// the flag or file.
std::unique_ptr<Tokenizer> build_tokenizer(const TokenizerOptions& options);

// What a model needs of the tokenizer the options name: its vocabulary size (GPT-2: 50257;
// NullTokenizer: --vocab-size + 1 for its EOD token, as Megatron's _NullTokenizer) and its
// end-of-document id (Megatron's tokenizer.eod: GPT-2's <|endoftext|>, NullTokenizer's
// --vocab-size, a SentencePiece or Hugging Face tokenizer's end of sequence). GPT-2's files are
// read only when named and the data is not `mock_data` (a known size otherwise); a type that
// reads --tokenizer-model reads it. A missing or bad file is a common::Error naming it.
struct TokenizerFacts {
  int64_t vocab_size = 0;
  int32_t end_of_document = 0;
};
TokenizerFacts tokenizer_facts(const TokenizerOptions& options, bool mock_data = false);

}  // namespace backend
