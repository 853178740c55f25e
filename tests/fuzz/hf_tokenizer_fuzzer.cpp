// libFuzzer target: HuggingFaceTokenizer on arbitrary bytes, with Llama 3's tokenizer.json
// (tests/data/llama3/tokenizer.json.xz, decompressed once at start-up by the project's own
// reader). The scan merge and the heap merge (with a word cache that empties every few
// pre-tokens) must give the same ids; every id is in the vocabulary; <|begin_of_text|> comes
// first; detokenizing gives back "<|begin_of_text|>" and the input with invalid UTF-8 replaced
// (unicode_text.hpp); Llama 3's pre-tokens tile the repaired text. The same bytes, read as a
// tokenizer.json, must load or be refused with a common::Error, nothing else. A difference, a
// crash or a sanitizer report is a finding.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "backend/common/error.hpp"
#include "backend/data/byte_level_bpe.hpp"
#include "backend/data/compressed_input.hpp"
#include "backend/data/hf_tokenizer.hpp"
#include "backend/data/unicode_text.hpp"

namespace {

void check(bool condition, const char* what) {
  if (!condition) {
    std::fprintf(stderr, "hf_tokenizer_fuzzer: %s\n", what);
    std::abort();
  }
}

// A private directory holding Llama 3's tokenizer.json and tokenizer_config.json.
std::filesystem::path llama3_directory() {
  const std::string data = std::string(FUZZ_SOURCE_DIR) + "/tests/data/llama3/";
  std::string pattern = (std::filesystem::temp_directory_path() / "hf_tokenizer_fuzzer_XXXXXX").string();
  check(mkdtemp(pattern.data()) != nullptr, "cannot make a temporary directory");
  const std::filesystem::path directory = pattern;
  backend::CompressedInput input(data + "tokenizer.json.xz");
  std::ofstream out(directory / "tokenizer.json", std::ios::binary);
  std::vector<char> buffer(1 << 20);
  while (const size_t n = input.read(buffer.data(), buffer.size())) out.write(buffer.data(), n);
  out.close();
  std::filesystem::copy_file(data + "tokenizer_config.json", directory / "tokenizer_config.json");
  return directory;
}

struct State {
  std::filesystem::path directory = llama3_directory();
  backend::HuggingFaceTokenizer scan{directory,
                                     {.word_cache_entries = 3, .heap_merge_min_bytes = 1 << 30}};
  backend::HuggingFaceTokenizer heap{directory,
                                     {.word_cache_entries = 0, .heap_merge_min_bytes = 0}};
  std::filesystem::path scratch = directory / "scratch";
  std::shared_ptr<backend::ByteLevelBpeTables> pattern_only = [] {
    auto tables = std::make_shared<backend::ByteLevelBpeTables>();
    tables->pattern = backend::PretokenizerPattern::llama3;
    return tables;
  }();
  backend::ByteLevelBpeEncoder splitter{pattern_only, {}};

  State() {
    std::filesystem::create_directory(scratch);
    std::ofstream(scratch / "tokenizer_config.json") << R"({"eos_token": "<|eos|>"})";
  }
  ~State() {
    std::error_code ignored;
    std::filesystem::remove_all(directory, ignored);
  }
};

std::unique_ptr<State> loaded_state;  // destroyed at exit, removing its directory

}  // namespace

// Loading two Llama 3 tokenizers under the sanitizers takes seconds; done here, outside
// libFuzzer's per-input -timeout (done lazily in the first input, it ran past the 20-second
// limit on a loaded 2-core CI machine and was reported as a timeout on the empty input).
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  loaded_state = std::make_unique<State>();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  State& state = *loaded_state;
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const std::string repaired = backend::replace_invalid_utf8(input);

  const std::vector<int32_t> ids = state.scan.tokenize(input);
  check(state.heap.tokenize(input) == ids, "the heap merge and the scan merge differ");
  check(!ids.empty() && ids[0] == 128000, "<|begin_of_text|> is not first");
  for (const int32_t id : ids) check(id >= 0 && id < state.scan.vocab_size(), "an id out of range");
  check(state.scan.detokenize(ids) == "<|begin_of_text|>" + repaired,
        "detokenize(tokenize(x)) is not <|begin_of_text|> and the repaired x");

  std::string joined;
  for (const std::string_view piece : state.splitter.pretokenize(repaired)) {
    check(!piece.empty(), "an empty pre-token");
    joined.append(piece);
  }
  check(joined == repaired, "the pre-tokens do not tile the text");

  // The input as a tokenizer.json: loaded or refused with a clear error.
  {
    std::ofstream out(state.scratch / "tokenizer.json", std::ios::binary | std::ios::trunc);
    out.write(input.data(), static_cast<std::streamsize>(input.size()));
  }
  try {
    backend::HuggingFaceTokenizer loaded(state.scratch);
    const std::vector<int32_t> loaded_ids = loaded.tokenize(input);
    for (const int32_t id : loaded_ids) {
      check(id >= 0 && id < loaded.vocab_size(), "a loaded tokenizer gave an id out of range");
    }
  } catch (const common::Error&) {
  }
  return 0;
}
