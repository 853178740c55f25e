// libFuzzer target: the GPT-2 BPE tokenizer on arbitrary bytes. The scan merge and the heap
// merge (and a word cache that empties every few pieces) must give the same ids; the pieces
// must tile the repaired text; detokenizing must give back exactly the input with invalid
// UTF-8 replaced (unicode_text.hpp). A difference, a crash or a sanitizer report is a finding.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "backend/data/gpt2_bpe_tokenizer.hpp"
#include "backend/data/unicode_text.hpp"

namespace {

std::string data_file(const char* name) {
  return std::string(FUZZ_SOURCE_DIR) + "/tests/data/" + name;
}

void check(bool condition, const char* what) {
  if (!condition) {
    std::fprintf(stderr, "tokenizer_fuzzer: %s\n", what);
    std::abort();
  }
}

// The two tokenizers: the scan merge with a word cache that empties every few pieces, and the
// heap merge for every word.
struct Tokenizers {
  backend::Gpt2BpeTokenizer scan{data_file("gpt2-vocab.json"),
                                 data_file("gpt2-merges.txt"),
                                 {.word_cache_entries = 3, .heap_merge_min_bytes = 1 << 30}};
  backend::Gpt2BpeTokenizer heap{data_file("gpt2-vocab.json"),
                                 data_file("gpt2-merges.txt"),
                                 {.word_cache_entries = 0, .heap_merge_min_bytes = 0}};
};

std::unique_ptr<Tokenizers> loaded_tokenizers;

}  // namespace

// Loading GPT-2's vocabulary and merges twice under the sanitizers at -O0 takes seconds; done
// here, outside libFuzzer's per-input -timeout (done lazily in the first input, it ran past the
// 20-second limit on a loaded 2-core CI machine and was reported as a timeout on the empty
// input, as hf_tokenizer_fuzzer's load once was).
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  loaded_tokenizers = std::make_unique<Tokenizers>();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  backend::Gpt2BpeTokenizer& scan = loaded_tokenizers->scan;
  backend::Gpt2BpeTokenizer& heap = loaded_tokenizers->heap;
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const std::string repaired = backend::replace_invalid_utf8(input);
  check(backend::is_valid_utf8(repaired), "the repaired text is not valid UTF-8");
  check(backend::is_valid_utf8(input) == (repaired == input), "validity and repair disagree");

  const std::vector<int32_t> ids = scan.tokenize(input);
  check(heap.tokenize(input) == ids, "the heap merge and the scan merge differ");
  check(scan.detokenize(ids) == repaired, "detokenize(tokenize(x)) is not the repaired x");

  std::string joined;
  for (const std::string_view piece : scan.pretokenize(repaired)) {
    check(!piece.empty(), "an empty piece");
    joined.append(piece);
  }
  check(joined == repaired, "the pieces do not tile the text");
  return 0;
}
