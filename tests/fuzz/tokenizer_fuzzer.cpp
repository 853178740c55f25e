// libFuzzer target: the GPT-2 BPE tokenizer on arbitrary bytes. The scan merge and the heap
// merge (and a word cache that empties every few pieces) must give the same ids; the pieces
// must tile the repaired text; detokenizing must give back exactly the input with invalid
// UTF-8 replaced (unicode_text.hpp). A difference, a crash or a sanitizer report is a finding.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
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

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static backend::Gpt2BpeTokenizer scan(data_file("gpt2-vocab.json"), data_file("gpt2-merges.txt"),
                                        {.word_cache_entries = 3, .heap_merge_min_bytes = 1 << 30});
  static backend::Gpt2BpeTokenizer heap(data_file("gpt2-vocab.json"), data_file("gpt2-merges.txt"),
                                        {.word_cache_entries = 0, .heap_merge_min_bytes = 0});
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
