// libFuzzer target: the three SentencePiece tokenizers (backend/data/sentencepiece_tokenizer.hpp,
// over Debian's libsentencepiece) on arbitrary bytes, with the test model
// tests/data/sentencepiece_bpe.model (BPE, byte fallback, identity normalization, whitespace
// kept: Llama 2's trainer settings). What must hold for every input x, r = x with invalid UTF-8
// replaced (unicode_text.hpp):
//   - every id lies in [0, vocab_size); tokenize appends to what the vector already holds; a
//     clone gives the same ids
//   - Llama2Tokenizer's ids are [bos] then GPTSentencePieceTokenizer's (Megatron's
//     tokenize(s, bos=True)), and both detokenize to the same text
//   - round trip: GPTSentencePieceTokenizer's detokenize(tokenize(x)) is r, when r does not hold
//     U+2581 (the model's own whitespace mark, which decoding turns into a space, by design)
//   - SentencePieceTokenizer gives exactly the model's ids when r holds no special token's first
//     byte ('<': all of this model's special tokens start with it), and otherwise ids whose
//     special tokens, counted, are no more than the times a '<' occurs
//   - detokenize of arbitrary ids in range gives valid UTF-8 (the library writes U+FFFD for a
//     byte piece sequence that is not UTF-8); an id out of range is a common::Error
// A difference, a crash, an exception other than that error, or a sanitizer report is a finding.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "backend/common/error.hpp"
#include "backend/data/sentencepiece_tokenizer.hpp"
#include "backend/data/unicode_text.hpp"

namespace {

using backend::SentencePieceTokenizer;

std::string model_file() { return std::string(FUZZ_SOURCE_DIR) + "/tests/data/sentencepiece_bpe.model"; }

void check(bool condition, const char* what) {
  if (!condition) {
    std::fprintf(stderr, "sentencepiece_tokenizer_fuzzer: %s\n", what);
    std::abort();
  }
}

bool all_in_range(const std::vector<int32_t>& ids, size_t from, int64_t vocab_size) {
  return std::all_of(ids.begin() + static_cast<std::ptrdiff_t>(from), ids.end(),
                     [&](int32_t id) { return id >= 0 && id < vocab_size; });
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static SentencePieceTokenizer gpt(SentencePieceTokenizer::Kind::gpt_sentencepiece, model_file());
  static SentencePieceTokenizer llama(SentencePieceTokenizer::Kind::llama2, model_file());
  static SentencePieceTokenizer special(SentencePieceTokenizer::Kind::sentencepiece, model_file(), 3);
  static const bool specials_start_with_angle = [] {
    for (const auto& [text, id] : special.special_tokens()) {
      if (text.empty() || text[0] != '<') return false;
    }
    return true;
  }();
  check(specials_start_with_angle, "a special token of the test model does not start with '<'");

  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const std::string repaired = backend::replace_invalid_utf8(input);

  // The model's ids, appended after what the vector holds.
  std::vector<int32_t> gpt_ids = {7, 8};
  gpt.tokenize(input, gpt_ids);
  check(gpt_ids[0] == 7 && gpt_ids[1] == 8, "tokenize overwrote the ids already in the vector");
  gpt_ids.erase(gpt_ids.begin(), gpt_ids.begin() + 2);
  check(all_in_range(gpt_ids, 0, gpt.vocab_size()), "GPTSentencePieceTokenizer: an id out of range");
  check(gpt.clone()->tokenize(input) == gpt_ids, "a clone gives other ids");
  check(gpt.tokenize(repaired) == gpt_ids, "the repaired text gives other ids than the input");

  const std::string decoded = gpt.detokenize(gpt_ids);
  if (repaired.find("\xe2\x96\x81") == std::string::npos) {
    check(decoded == repaired, "GPTSentencePieceTokenizer: detokenize(tokenize(x)) is not x repaired");
  }

  const std::vector<int32_t> llama_ids = llama.tokenize(input);
  check(!llama_ids.empty() && llama_ids[0] == llama.bos(), "Llama2Tokenizer: the first id is not bos");
  check(std::equal(llama_ids.begin() + 1, llama_ids.end(), gpt_ids.begin(), gpt_ids.end()),
        "Llama2Tokenizer's ids after bos are not the model's");
  check(llama.detokenize(llama_ids) == decoded, "Llama2Tokenizer detokenizes otherwise");

  const std::vector<int32_t> special_ids = special.tokenize(input);
  check(all_in_range(special_ids, 0, special.vocab_size()), "SentencePieceTokenizer: an id out of range");
  const auto angles = static_cast<size_t>(std::count(repaired.begin(), repaired.end(), '<'));
  if (angles == 0) {
    check(special_ids == gpt_ids, "SentencePieceTokenizer without special text differs from the model");
  }
  size_t specials_found = 0;
  for (const int32_t id : special_ids) {
    for (const auto& [text, special_id] : special.special_tokens()) {
      if (id == special_id && id >= special.piece_count()) ++specials_found;
    }
  }
  check(specials_found <= angles, "more added special tokens than '<' in the text");

  // Arbitrary ids: two bytes each, folded into the vocabulary; and one past its end.
  std::vector<int32_t> arbitrary;
  for (size_t i = 0; i + 1 < size; i += 2) {
    arbitrary.push_back(static_cast<int32_t>((data[i] | (data[i + 1] << 8)) % special.vocab_size()));
  }
  check(backend::is_valid_utf8(special.detokenize(arbitrary)), "detokenize wrote invalid UTF-8");
  for (int32_t& id : arbitrary) id %= static_cast<int32_t>(gpt.vocab_size());
  check(backend::is_valid_utf8(gpt.detokenize(arbitrary)), "detokenize wrote invalid UTF-8");
  arbitrary.push_back(static_cast<int32_t>(gpt.vocab_size()));
  bool refused = false;
  try {
    (void)gpt.detokenize(arbitrary);
  } catch (const common::Error&) {
    refused = true;
  }
  check(refused, "an id out of range was not refused");
  return 0;
}
