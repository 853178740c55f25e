// Megatron-LM's three SentencePiece tokenizers (megatron/training/tokenizer/tokenizer.py) over
// Debian's libsentencepiece, from a SentencePiece model file (--tokenizer-model, the protobuf
// ModelProto that spm_train writes and Llama ships as tokenizer.model). The three differ only
// in what they add around the model's ids:
//   GPTSentencePieceTokenizer  the model's ids as they are (sp.encode_as_ids); eod is the
//                              model's eos_id; vocab_size the model's piece count
//   Llama2Tokenizer            the model's bos_id, then the model's ids (Megatron's
//                              tokenize(s, bos=True, eos=False)); eod is eos_id; vocab_size the
//                              piece count
//   SentencePieceTokenizer     Megatron's special tokens <CLS> <SEP> <EOD> <MASK>, the model's
//                              pad/bos/eos pieces (<PAD> <BOS> <EOS> where the model has none)
//                              and <extra_id_0> .. <extra_id_{N-1}> (--vocab-extra-ids N), each
//                              added after the model's pieces when the model lacks it; eod is
//                              <EOD>; vocab_size counts the added tokens. A special token's text
//                              in a document is that token's id: the text is cut at the earliest
//                              special token (the first-added one on a tie, as Megatron's
//                              min() over an insertion-ordered dict) and the parts between are
//                              encoded on their own (NeMo's tokenizer, which Megatron copies).
// Text is bytes, as for the GPT-2 tokenizer: invalid UTF-8 is first replaced as Python's
// bytes.decode("utf-8", "replace") does (unicode_text.hpp), so the ids are those Megatron
// computes for the text a Python reader would have made.
//
// Where Megatron would write nonsense, this refuses at load: Llama2Tokenizer with a model that
// has no BOS piece (Megatron would prepend the id -1), and Llama2Tokenizer or
// GPTSentencePieceTokenizer with no EOS piece (their eod would be -1). A missing file or one
// that is not a SentencePiece model is a common::Error naming --tokenizer-model and the file.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "backend/data/tokenizer.hpp"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace backend {

class SentencePieceTokenizer final : public Tokenizer {
 public:
  enum class Kind { sentencepiece, gpt_sentencepiece, llama2 };

  // `vocab_extra_ids` is --vocab-extra-ids: only SentencePieceTokenizer adds them.
  SentencePieceTokenizer(Kind kind, const std::filesystem::path& model_file,
                         int64_t vocab_extra_ids = 0);
  ~SentencePieceTokenizer() override;
  SentencePieceTokenizer(const SentencePieceTokenizer&) = default;
  SentencePieceTokenizer& operator=(const SentencePieceTokenizer&) = delete;

  int64_t vocab_size() const override { return vocab_size_; }
  int32_t eod() const override { return eod_; }
  using Tokenizer::tokenize;
  void tokenize(std::string_view text, std::vector<int32_t>& ids) override;
  // Megatron's detokenize: the model's decode_ids; for SentencePieceTokenizer a special token
  // is written as its text between spaces ("a <EOD> b"), as Megatron writes it.
  std::string detokenize(std::span<const int32_t> ids) const override;
  std::unique_ptr<Tokenizer> clone() const override;

  // The model's own pieces (without the tokens SentencePieceTokenizer adds).
  int64_t piece_count() const { return piece_count_; }
  // Megatron's bos, eos and pad ids (-1 where the model has none; for SentencePieceTokenizer
  // the ids of <BOS>, <EOS>, <PAD> or the model's pieces for them).
  int32_t bos() const { return bos_; }
  int32_t eos() const { return eos_; }
  int32_t pad() const { return pad_; }
  // SentencePieceTokenizer's special tokens in Megatron's order, with their ids; empty for the
  // other two kinds.
  const std::vector<std::pair<std::string, int32_t>>& special_tokens() const;

 private:
  struct Model;
  void encode_part(std::string_view text, std::vector<int32_t>& ids);

  Kind kind_;
  std::shared_ptr<const Model> model_;  // read-only, shared by clones
  int64_t piece_count_ = 0, vocab_size_ = 0;
  int32_t eod_ = -1, bos_ = -1, eos_ = -1, pad_ = -1;
  // Scratch reused across calls: the repaired text, the library's int ids, and (for
  // SentencePieceTokenizer) where each special token next occurs.
  std::string repaired_text_;
  std::vector<int> part_ids_;
  std::vector<size_t> next_match_;
};

// The SentencePiece kind a --tokenizer-type names, or nullopt for the other types.
std::optional<SentencePieceTokenizer::Kind> sentencepiece_kind(std::string_view tokenizer_type);

}  // namespace backend
