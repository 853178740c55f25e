// Megatron's _NullTokenizer (megatron/training/tokenizer/tokenizer.py): the "text" already
// holds the token ids as decimal integers separated by spaces, for tests and for runs that
// only need a vocabulary size (--tokenizer-type NullTokenizer --vocab-size N). Ids are
// 0 .. N−1 for text and N for the end of document, so vocab_size() is N + 1 and eod() is N.
//
// Megatron splits on single spaces and converts each field with Python's int(); we accept
// every text it accepts with the same ids, and more: fields are separated by any run of ASCII
// whitespace (Megatron fails on two spaces in a row or a newline between ids), and empty
// text is no ids. Each field is an optional '+' and ASCII digits (Python's int() would also
// take underscores and non-ASCII digits; Megatron data never has them). An id outside
// [0, N] is an error here, where Megatron would fail later in the embedding lookup.
#pragma once

#include "backend/data/tokenizer.hpp"

namespace backend {

class NullTokenizer final : public Tokenizer {
 public:
  // `vocab_size` is --vocab-size: the number of ids text may use, eod excluded.
  explicit NullTokenizer(int64_t vocab_size);

  int64_t vocab_size() const override { return vocab_size_without_eod_ + 1; }
  int32_t eod() const override { return static_cast<int32_t>(vocab_size_without_eod_); }
  using Tokenizer::tokenize;
  void tokenize(std::string_view text, std::vector<int32_t>& ids) override;
  // The ids as decimal integers joined by single spaces (Megatron's detokenize).
  std::string detokenize(std::span<const int32_t> ids) const override;
  std::unique_ptr<Tokenizer> clone() const override;

 private:
  int64_t vocab_size_without_eod_;
};

}  // namespace backend
