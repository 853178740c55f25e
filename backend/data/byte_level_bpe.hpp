// The byte-level BPE machinery shared by GPT2BPETokenizer (gpt2_bpe_tokenizer.hpp) and
// HuggingFaceTokenizer (hf_tokenizer.hpp): both split text into pre-tokens, map each pre-token's
// bytes to single-byte tokens and merge adjacent pairs by rank (Radford et al. 2019, section
// 2.2; OpenAI's gpt-2 src/encoder.py; the BPE model of Hugging Face `tokenizers`).
//
// Byte characters: GPT-2's encoder.py bytes_to_unicode, which Hugging Face's ByteLevel
// pre-tokenizer shares: the 188 printable bytes '!'..'~', '¡'..'¬', '®'..'ÿ' stand for
// themselves, the other 68 bytes take U+0100..U+0143 in byte order, so every vocabulary entry
// is printable text.
//
// Pre-tokenization patterns, written as scanners over UTF-8 (no regular expression engine),
// with the leftmost-alternative, greedy, backtracking semantics of Python's `regex` module and
// Oniguruma (what Hugging Face `tokenizers` uses); \s is Unicode White_Space, \p{L} and \p{N}
// general categories (unicode_text.hpp):
//   gpt2    's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//   llama3  (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//           ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//           (Llama 3's tokenizer.json, the same as tiktoken's cl100k_base; the case-insensitive
//           contractions use Unicode simple case folding, so "'ſ" (U+017F) is a contraction too).
//
// Merging: the lowest-ranked adjacent pair is merged, every occurrence left to right, until no
// pair has a rank. Hugging Face's priority queue of (rank, position) merges the same pairs: two
// candidates of one rank are one pair of tokens, and a merge cannot create another candidate of
// that rank (the merged token is longer than either half), so both finish a rank's occurrences
// left to right before any other. ignore_merges (Llama 3): a pre-token that is itself a
// vocabulary entry is that one id, without merging.
//
// Speed: a word cache maps a pre-token's bytes to its ids (most pre-tokens of real text repeat),
// so BPE runs only for new ones; the cache is a flat open-addressing table with arena storage,
// emptied when full, so memory stays bounded and nothing is allocated per token once warm.
// Long pre-tokens use a heap-driven merge with the same results as the quadratic scan.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "backend/data/unicode_text.hpp"

namespace backend {

// The character GPT-2's mapping gives `byte`.
char32_t byte_level_character(uint8_t byte);

// A vocabulary or merges token (text in byte characters) → the bytes it stands for. False, with
// `bad` set to the first character that is not a byte character, if there is one.
bool byte_level_text_to_bytes(std::string_view text, std::string& bytes, char32_t& bad);

enum class PretokenizerPattern : uint8_t { gpt2, llama3 };

// The end of the pre-token that starts at p (p < end) of valid UTF-8.
const unsigned char* pretoken_end(PretokenizerPattern pattern, const CharacterClasses& classes,
                                  const unsigned char* p, const unsigned char* end);

// Calls emit(piece) for each pre-token of valid UTF-8 `text`, in order; they tile the text.
template <typename Emit>
void for_each_pretoken(PretokenizerPattern pattern, const CharacterClasses& classes,
                       std::string_view text, Emit&& emit) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const auto* end = p + text.size();
  while (p < end) {
    const unsigned char* stop = pretoken_end(pattern, classes, p, end);
    emit(std::string_view(reinterpret_cast<const char*>(p), static_cast<size_t>(stop - p)));
    p = stop;
  }
}

// The read-only tables of one vocabulary, shared by clones.
struct ByteLevelBpeTables {
  struct Merge {
    uint64_t pair = kEmpty;  // left id << 32 | right id
    int32_t rank = 0;
    int32_t merged = 0;
  };
  static constexpr uint64_t kEmpty = ~uint64_t{0};

  int64_t vocab_size = 0;
  std::array<int32_t, 256> byte_token{};
  std::vector<uint32_t> token_offsets;  // bytes of id i: token_bytes[offsets[i], offsets[i+1])
  std::string token_bytes;
  std::vector<Merge> merges;  // open addressing, power-of-two size
  uint64_t merge_mask = 0;
  PretokenizerPattern pattern = PretokenizerPattern::gpt2;
  bool ignore_merges = false;
  // ignore_merges only: the bytes of each BPE vocabulary entry → its id (views into token_bytes).
  std::unordered_map<std::string_view, int32_t> id_of_bytes;
  CharacterClasses classes;

  // Fills vocab_size, token_offsets and token_bytes from the bytes of ids 0 .. N−1.
  void set_tokens(const std::vector<std::string>& bytes_of_id);
  // Fills the merge table from (left, right, merged) triples, best first; a pair listed twice
  // keeps its later rank, as Python's dict(zip(merges, ranks)) and HF's HashMap do.
  void set_merges(const std::vector<std::array<int32_t, 3>>& merges_by_rank);
  // The bytes of `id` (0 ≤ id < vocab_size).
  std::string_view bytes_of(int32_t id) const {
    return std::string_view(token_bytes).substr(token_offsets[id],
                                                token_offsets[id + 1] - token_offsets[id]);
  }
  const Merge* find_merge(int32_t left, int32_t right) const;
};

struct ByteLevelBpeOptions {
  // Distinct pre-tokens the word cache holds before it is emptied (0 disables the cache).
  int64_t word_cache_entries = 1 << 16;
  // Pre-tokens of at least this many bytes use the heap-driven merge, shorter ones the
  // quadratic scan; both give identical ids (tests run the fixtures through each).
  int64_t heap_merge_min_bytes = 48;
};

// Pre-tokenization and BPE of valid UTF-8 text with one set of tables; one instance per thread
// (the cache and scratch buffers are its own).
class ByteLevelBpeEncoder {
 public:
  ByteLevelBpeEncoder(std::shared_ptr<const ByteLevelBpeTables> tables,
                      ByteLevelBpeOptions options);
  ~ByteLevelBpeEncoder();
  ByteLevelBpeEncoder(const ByteLevelBpeEncoder& other);  // same tables, an empty cache
  ByteLevelBpeEncoder& operator=(const ByteLevelBpeEncoder&) = delete;

  // Appends the ids of valid UTF-8 `text`.
  void encode(std::string_view text, std::vector<int32_t>& ids);
  // The pre-tokens of valid UTF-8 `text`.
  std::vector<std::string_view> pretokenize(std::string_view text) const;

  const ByteLevelBpeTables& tables() const { return *tables_; }

 private:
  class WordCache;
  struct HeapEntry {
    int32_t rank, position, left, right, merged;
  };

  void encode_piece(std::string_view piece, std::vector<int32_t>& ids);
  void merge_by_scan(std::vector<int32_t>& symbols) const;
  void merge_by_heap(std::vector<int32_t>& symbols);

  std::shared_ptr<const ByteLevelBpeTables> tables_;
  ByteLevelBpeOptions options_;
  std::unique_ptr<WordCache> cache_;
  // Scratch reused across calls: BPE symbols and the heap's work arrays.
  std::vector<int32_t> symbols_;
  std::vector<HeapEntry> heap_, batch_;
  std::vector<int32_t> next_, previous_, touched_;
};

}  // namespace backend
