// Megatron's HuggingFaceTokenizer (megatron/training/tokenizer/tokenizer.py,
// _HuggingFaceTokenizer, at Megatron-LM 4ff7686c, the last commit with the legacy tokenizers)
// for the byte-level BPE `tokenizer.json` that GPT-2, Llama 3 and many others ship. Megatron
// builds it with transformers.AutoTokenizer.from_pretrained(--tokenizer-model) and uses
//   tokenize(text)  = tokenizer(text).input_ids   (special tokens added: Llama 3's BOS)
//   detokenize(ids) = tokenizer.decode(ids)        (special tokens kept as their text)
//   vocab_size      = len(tokenizer)               (the vocabulary with the added tokens)
//   eod             = tokenizer.eos_token_id
// --tokenizer-model is the directory holding tokenizer.json (or that file itself). What is read:
//   tokenizer.json  model: type "BPE", vocab, merges ("a b" strings or ["a", "b"] pairs),
//                   ignore_merges (a pre-token that is a vocabulary entry is that one id);
//                   byte_fallback, dropout, continuing_subword_prefix and end_of_word_suffix
//                   are refused when set (no byte-level file uses them);
//                   added_tokens: matched in the text before pre-tokenization, leftmost then
//                   longest, special or not, as `tokenizers`' AddedVocabulary does for
//                   encode(text) (a literal "<|eot_id|>" in a Llama 3 document is id 128009);
//                   lstrip/rstrip/single_word are refused when true;
//                   normalizer: none (others refused);
//                   pre_tokenizer: ByteLevel with use_regex (GPT-2's pattern), or Sequence of
//                   Split{Regex, Isolated} and ByteLevel{use_regex: false}, with the Split regex
//                   GPT-2's or Llama 3's (= cl100k_base's), implemented by hand
//                   (byte_level_bpe.hpp); any other regex is refused, quoted;
//                   add_prefix_space must be false;
//                   post_processor: none, ByteLevel (ids unchanged), TemplateProcessing (the
//                   `single` template's special tokens around the text: Llama 3's
//                   <|begin_of_text|>), or a Sequence of these;
//                   decoder: none or ByteLevel.
//   tokenizer_config.json (next to tokenizer.json): eos_token, a string or {"content": ...};
//                   if absent, special_tokens_map.json's. No eos_token anywhere is an error:
//                   Megatron's eod would be None.
// The ids of the vocabulary and the added tokens together must be 0 .. N−1; N is vocab_size().
// Invalid UTF-8 is replaced first, as for GPT2BPETokenizer (unicode_text.hpp): the reference
// receives Python strings.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "backend/data/byte_level_bpe.hpp"
#include "backend/data/tokenizer.hpp"

namespace backend {

class HuggingFaceTokenizer final : public Tokenizer {
 public:
  struct Tables;  // added tokens, template ids, eod

  // `model_path`: a directory holding tokenizer.json, or the tokenizer.json file.
  explicit HuggingFaceTokenizer(const std::filesystem::path& model_path,
                                ByteLevelBpeOptions options = {});
  ~HuggingFaceTokenizer() override;
  HuggingFaceTokenizer(const HuggingFaceTokenizer& other);
  HuggingFaceTokenizer& operator=(const HuggingFaceTokenizer&) = delete;

  int64_t vocab_size() const override;
  int32_t eod() const override;
  using Tokenizer::tokenize;
  void tokenize(std::string_view text, std::vector<int32_t>& ids) override;
  std::string detokenize(std::span<const int32_t> ids) const override;
  std::unique_ptr<Tokenizer> clone() const override;

  // The ids the post-processor puts before and after the text's (Llama 3: {128000}, {}).
  std::span<const int32_t> prefix_ids() const;
  std::span<const int32_t> suffix_ids() const;

 private:
  using Loaded = std::pair<std::shared_ptr<const Tables>, std::shared_ptr<const ByteLevelBpeTables>>;
  static Loaded load(const std::filesystem::path& model_path);
  HuggingFaceTokenizer(Loaded loaded, ByteLevelBpeOptions options);

  std::shared_ptr<const Tables> tables_;
  std::shared_ptr<const ByteLevelBpeTables> bpe_;
  ByteLevelBpeEncoder encoder_;
  std::string repaired_text_;  // scratch: the text with invalid UTF-8 replaced
};

}  // namespace backend
