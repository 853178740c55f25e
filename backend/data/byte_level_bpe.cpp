// Byte-level BPE shared by the GPT-2 and Hugging Face tokenizers: the byte characters, the
// pre-tokenization scanners, the merge table, the two merge loops and the word cache (the rules
// and their sources are in byte_level_bpe.hpp).
#include "backend/data/byte_level_bpe.hpp"

#include <algorithm>
#include <cstring>
#include <limits>

#include "backend/common/error.hpp"
#include "backend/common/modular_arithmetic.hpp"
#include "backend/common/splitmix64.hpp"

namespace backend {
namespace {

struct ByteCharacters {
  std::array<char32_t, 256> of_byte{};
  std::array<int16_t, 0x144> byte_of{};  // −1: not a byte character

  ByteCharacters() {
    byte_of.fill(-1);
    char32_t next = 0x100;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      of_byte[b] = printable ? char32_t(b) : next++;
      byte_of[of_byte[b]] = static_cast<int16_t>(b);
    }
  }
};

const ByteCharacters& byte_characters() {
  static const ByteCharacters characters;  // immutable, built once
  return characters;
}

COMMON_MODULAR_ARITHMETIC uint64_t hash_bytes(const unsigned char* p, size_t n) {
  uint64_t hash = common::kSplitmixIncrement * (n + 1);
  while (n >= 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    hash = common::splitmix64_mix(hash ^ word);
    p += 8;
    n -= 8;
  }
  uint64_t tail = 0;
  std::memcpy(&tail, p, n);
  return common::splitmix64_mix(hash ^ tail);
}

uint64_t pair_key(int32_t left, int32_t right) {
  return (uint64_t(uint32_t(left)) << 32) | uint32_t(right);
}

inline CharacterClass class_at(const CharacterClasses& classes, const unsigned char* p,
                               int& length) {
  if (*p < 0x80) {
    length = 1;
    return classes.of(*p);
  }
  char32_t c;
  length = decode_utf8(p, c);
  return classes.of(c);
}

// The end of a run of `run_class` characters starting at q.
inline const unsigned char* run_end(const CharacterClasses& classes, const unsigned char* q,
                                    const unsigned char* end, CharacterClass run_class) {
  int length;
  while (q < end && class_at(classes, q, length) == run_class) q += length;
  return q;
}

// '\s+(?!\S)|\s+' from p (a whitespace character): the whole run when it ends the text;
// otherwise the run but its last character (which then starts the next piece), or the single
// character of a run of one. With `newline_end` ('\s*[\r\n]+', tried first by llama3): the end
// of the run's last CR or LF, when it has one.
inline const unsigned char* whitespace_end(const CharacterClasses& classes, const unsigned char* p,
                                           const unsigned char* end, bool newline_end) {
  int length;
  class_at(classes, p, length);
  const unsigned char* q = p + length;
  const unsigned char* last_start = p;
  const unsigned char* after_newline = (*p == '\r' || *p == '\n') ? q : nullptr;
  int count = 1;
  while (q < end && class_at(classes, q, length) == CharacterClass::whitespace) {
    last_start = q;
    if (*q == '\r' || *q == '\n') after_newline = q + 1;
    q += length;
    ++count;
  }
  if (newline_end && after_newline != nullptr) return after_newline;
  if (q == end || count == 1) return q;
  return last_start;
}

const unsigned char* gpt2_pretoken_end(const CharacterClasses& classes, const unsigned char* p,
                                       const unsigned char* end) {
  // 's|'t|'re|'ve|'m|'ll|'d
  if (*p == '\'' && p + 1 < end) {
    const unsigned char c1 = p[1];
    if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return p + 2;
    if (p + 2 < end) {
      const unsigned char c2 = p[2];
      if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) {
        return p + 3;
      }
    }
  }
  int length;
  const CharacterClass first = class_at(classes, p, length);
  CharacterClass run_class = first;
  const unsigned char* q = p + length;
  // ' ?\p{L}+', ' ?\p{N}+', ' ?[^\s\p{L}\p{N}]+': one optional ASCII space, then a run.
  if (*p == ' ' && q < end) {
    int next_length;
    const CharacterClass next = class_at(classes, q, next_length);
    if (next != CharacterClass::whitespace) {
      run_class = next;
      q += next_length;
    }
  }
  if (run_class != CharacterClass::whitespace) return run_end(classes, q, end, run_class);
  return whitespace_end(classes, p, end, /*newline_end=*/false);
}

const unsigned char* llama3_pretoken_end(const CharacterClasses& classes, const unsigned char* p,
                                         const unsigned char* end) {
  // (?i:'s|'t|'re|'ve|'m|'ll|'d). `| 0x20` lowers an ASCII letter; the targets are lowercase
  // ASCII, so only their two cases compare equal. U+017F (ſ, C5 BF) folds to 's'.
  if (*p == '\'' && p + 1 < end) {
    const unsigned char c1 = p[1] | 0x20;
    if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return p + 2;
    if (p[1] == 0xC5 && p + 2 < end && p[2] == 0xBF) return p + 3;
    if (p + 2 < end) {
      const unsigned char c2 = p[2] | 0x20;
      if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) {
        return p + 3;
      }
    }
  }
  int length;
  const CharacterClass first = class_at(classes, p, length);
  const unsigned char* q = p + length;
  // [^\r\n\p{L}\p{N}]?\p{L}+
  if (first == CharacterClass::letter) return run_end(classes, q, end, CharacterClass::letter);
  if (first != CharacterClass::number && *p != '\r' && *p != '\n' && q < end) {
    int next_length;
    if (class_at(classes, q, next_length) == CharacterClass::letter) {
      return run_end(classes, q + next_length, end, CharacterClass::letter);
    }
  }
  // \p{N}{1,3}
  if (first == CharacterClass::number) {
    for (int count = 1; count < 3 && q < end; ++count) {
      int next_length;
      if (class_at(classes, q, next_length) != CharacterClass::number) break;
      q += next_length;
    }
    return q;
  }
  // ' ?[^\s\p{L}\p{N}]+[\r\n]*'
  const unsigned char* other_start = nullptr;
  if (first == CharacterClass::other) {
    other_start = q;
  } else if (*p == ' ' && q < end) {
    int next_length;
    if (class_at(classes, q, next_length) == CharacterClass::other) other_start = q + next_length;
  }
  if (other_start != nullptr) {
    q = run_end(classes, other_start, end, CharacterClass::other);
    while (q < end && (*q == '\r' || *q == '\n')) ++q;
    return q;
  }
  // \s*[\r\n]+|\s+(?!\S)|\s+ (first is whitespace here)
  return whitespace_end(classes, p, end, /*newline_end=*/true);
}

constexpr size_t kMaxCachedPieceBytes = 255;

}  // namespace

char32_t byte_level_character(uint8_t byte) { return byte_characters().of_byte[byte]; }

bool byte_level_text_to_bytes(std::string_view text, std::string& bytes, char32_t& bad) {
  bytes.clear();
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const auto* end = p + text.size();
  while (p < end) {
    char32_t c;
    p += decode_utf8(p, c);
    const int16_t byte = c < 0x144 ? byte_characters().byte_of[c] : int16_t(-1);
    if (byte < 0) {
      bad = c;
      return false;
    }
    bytes.push_back(static_cast<char>(byte));
  }
  return true;
}

const unsigned char* pretoken_end(PretokenizerPattern pattern, const CharacterClasses& classes,
                                  const unsigned char* p, const unsigned char* end) {
  return pattern == PretokenizerPattern::llama3 ? llama3_pretoken_end(classes, p, end)
                                                : gpt2_pretoken_end(classes, p, end);
}

// ---- tables
void ByteLevelBpeTables::set_tokens(const std::vector<std::string>& bytes_of_id) {
  vocab_size = static_cast<int64_t>(bytes_of_id.size());
  token_offsets.clear();
  token_bytes.clear();
  token_offsets.reserve(bytes_of_id.size() + 1);
  token_offsets.push_back(0);
  for (const std::string& token : bytes_of_id) {
    token_bytes += token;
    if (token_bytes.size() > std::numeric_limits<uint32_t>::max()) {
      common::fail("the vocabulary's tokens hold more than 4 GiB of text");
    }
    token_offsets.push_back(static_cast<uint32_t>(token_bytes.size()));
  }
}

void ByteLevelBpeTables::set_merges(const std::vector<std::array<int32_t, 3>>& merges_by_rank) {
  size_t slots = 16;
  while (slots < merges_by_rank.size() * 2) slots *= 2;
  merges.assign(slots, {});
  merge_mask = slots - 1;
  for (size_t rank = 0; rank < merges_by_rank.size(); ++rank) {
    const auto& [left, right, merged] = merges_by_rank[rank];
    const uint64_t key = pair_key(left, right);
    for (uint64_t slot = common::splitmix64_mix(key) & merge_mask;;
         slot = (slot + 1) & merge_mask) {
      Merge& merge = merges[slot];
      if (merge.pair == key || merge.pair == kEmpty) {
        merge = {key, static_cast<int32_t>(rank), merged};
        break;
      }
    }
  }
}

const ByteLevelBpeTables::Merge* ByteLevelBpeTables::find_merge(int32_t left,
                                                                int32_t right) const {
  const uint64_t key = pair_key(left, right);
  for (uint64_t slot = common::splitmix64_mix(key) & merge_mask;;
       slot = (slot + 1) & merge_mask) {
    const Merge& merge = merges[slot];
    if (merge.pair == key) return &merge;
    if (merge.pair == kEmpty) return nullptr;
  }
}

// ---- the word cache: piece bytes → ids in one open-addressing table over two arenas.
// Emptied (not evicted piecemeal) when it reaches its entry limit: real text's frequent
// pieces come back within a few thousand words, and a flat table with no per-entry
// allocation is what keeps a hit cheaper than the scanner that found the piece.
class ByteLevelBpeEncoder::WordCache {
 public:
  explicit WordCache(int64_t max_entries) : max_entries_(static_cast<size_t>(max_entries)) {
    size_t slots = 16;
    while (slots < max_entries_ * 2) slots *= 2;
    slots_.assign(slots, Slot{});
    mask_ = slots - 1;
  }

  // The cached ids of `piece`, or {nullptr, 0}.
  std::span<const int32_t> find(std::string_view piece, uint64_t hash) const {
    for (size_t slot = hash & mask_;; slot = (slot + 1) & mask_) {
      const Slot& entry = slots_[slot];
      if (entry.key_length == 0) return {};
      if (entry.hash == hash && entry.key_length == piece.size() &&
          std::memcmp(keys_.data() + entry.key_offset, piece.data(), piece.size()) == 0) {
        return {ids_.data() + entry.ids_offset, entry.ids_count};
      }
    }
  }

  void insert(std::string_view piece, uint64_t hash, std::span<const int32_t> ids) {
    if (entries_ >= max_entries_) clear();
    size_t slot = hash & mask_;
    while (slots_[slot].key_length != 0) slot = (slot + 1) & mask_;
    slots_[slot] = {hash, static_cast<uint32_t>(keys_.size()), static_cast<uint32_t>(ids_.size()),
                    static_cast<uint16_t>(piece.size()), static_cast<uint16_t>(ids.size())};
    keys_.append(piece);
    ids_.insert(ids_.end(), ids.begin(), ids.end());
    ++entries_;
  }

 private:
  struct Slot {
    uint64_t hash = 0;
    uint32_t key_offset = 0, ids_offset = 0;
    uint16_t key_length = 0, ids_count = 0;  // key_length 0: empty (cached pieces have ≥ 2 bytes)
  };

  void clear() {
    std::fill(slots_.begin(), slots_.end(), Slot{});
    keys_.clear();
    ids_.clear();
    entries_ = 0;
  }

  size_t max_entries_;
  size_t entries_ = 0;
  std::vector<Slot> slots_;
  size_t mask_ = 0;
  std::string keys_;
  std::vector<int32_t> ids_;
};

ByteLevelBpeEncoder::ByteLevelBpeEncoder(std::shared_ptr<const ByteLevelBpeTables> tables,
                                         ByteLevelBpeOptions options)
    : tables_(std::move(tables)), options_(options) {
  if (options_.word_cache_entries < 0 || options_.heap_merge_min_bytes < 0) {
    common::fail("byte-level BPE options: word_cache_entries and heap_merge_min_bytes must be ≥ 0");
  }
  if (options_.word_cache_entries > 0) {
    cache_ = std::make_unique<WordCache>(options_.word_cache_entries);
  }
}

ByteLevelBpeEncoder::ByteLevelBpeEncoder(const ByteLevelBpeEncoder& other)
    : tables_(other.tables_), options_(other.options_) {
  if (options_.word_cache_entries > 0) {
    cache_ = std::make_unique<WordCache>(options_.word_cache_entries);
  }
}

ByteLevelBpeEncoder::~ByteLevelBpeEncoder() = default;

void ByteLevelBpeEncoder::encode(std::string_view text, std::vector<int32_t>& ids) {
  for_each_pretoken(tables_->pattern, tables_->classes, text,
                    [&](std::string_view piece) { encode_piece(piece, ids); });
}

std::vector<std::string_view> ByteLevelBpeEncoder::pretokenize(std::string_view text) const {
  std::vector<std::string_view> pieces;
  for_each_pretoken(tables_->pattern, tables_->classes, text,
                    [&](std::string_view piece) { pieces.push_back(piece); });
  return pieces;
}

void ByteLevelBpeEncoder::encode_piece(std::string_view piece, std::vector<int32_t>& ids) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(piece.data());
  if (piece.size() == 1) {
    ids.push_back(tables_->byte_token[bytes[0]]);
    return;
  }
  const bool cacheable = cache_ && piece.size() <= kMaxCachedPieceBytes;
  uint64_t hash = 0;
  if (cacheable) {
    hash = hash_bytes(bytes, piece.size());
    const std::span<const int32_t> cached = cache_->find(piece, hash);
    if (!cached.empty()) {
      ids.insert(ids.end(), cached.begin(), cached.end());
      return;
    }
  }
  if (tables_->ignore_merges) {
    if (const auto found = tables_->id_of_bytes.find(piece); found != tables_->id_of_bytes.end()) {
      ids.push_back(found->second);
      if (cacheable) cache_->insert(piece, hash, std::span<const int32_t>(&found->second, 1));
      return;
    }
  }
  symbols_.resize(piece.size());
  for (size_t i = 0; i < piece.size(); ++i) symbols_[i] = tables_->byte_token[bytes[i]];
  if (static_cast<int64_t>(piece.size()) >= options_.heap_merge_min_bytes) {
    merge_by_heap(symbols_);
  } else {
    merge_by_scan(symbols_);
  }
  ids.insert(ids.end(), symbols_.begin(), symbols_.end());
  if (cacheable) cache_->insert(piece, hash, symbols_);
}

// The original loop: find the adjacent pair with the lowest rank, merge each of its
// occurrences left to right (an occurrence overlapping one just merged is skipped), repeat.
// Quadratic in the piece length, fastest for the short pieces that dominate text.
void ByteLevelBpeEncoder::merge_by_scan(std::vector<int32_t>& symbols) const {
  size_t size = symbols.size();
  while (size > 1) {
    const ByteLevelBpeTables::Merge* best = nullptr;
    for (size_t i = 0; i + 1 < size; ++i) {
      const ByteLevelBpeTables::Merge* merge = tables_->find_merge(symbols[i], symbols[i + 1]);
      if (merge != nullptr && (best == nullptr || merge->rank < best->rank)) best = merge;
    }
    if (best == nullptr) break;
    const auto left = static_cast<int32_t>(best->pair >> 32);
    const auto right = static_cast<int32_t>(best->pair & 0xFFFFFFFFu);
    size_t out = 0;
    for (size_t i = 0; i < size;) {
      if (i + 1 < size && symbols[i] == left && symbols[i + 1] == right) {
        symbols[out++] = best->merged;
        i += 2;
      } else {
        symbols[out++] = symbols[i++];
      }
    }
    size = out;
  }
  symbols.resize(size);
}

// The same passes in O(n log n) for long pieces: symbols form a linked list, candidate pairs
// wait in a min-heap ordered by (rank, position). All candidates of the lowest rank are taken
// out together and merged left to right, skipping any whose symbols changed meanwhile (the
// overlap rule of the original); the pairs the merges create enter the heap only after the
// batch, exactly as the original recomputes pairs only after a full pass.
void ByteLevelBpeEncoder::merge_by_heap(std::vector<int32_t>& symbols) {
  const auto size = static_cast<int32_t>(symbols.size());
  next_.resize(size);
  previous_.resize(size);
  for (int32_t i = 0; i < size; ++i) {
    next_[i] = i + 1 < size ? i + 1 : -1;
    previous_[i] = i - 1;
  }
  const auto later = [](const HeapEntry& a, const HeapEntry& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.position > b.position;
  };
  const auto candidate = [&](int32_t position) {
    const int32_t right = next_[position];
    if (right < 0) return;
    const ByteLevelBpeTables::Merge* merge = tables_->find_merge(symbols[position], symbols[right]);
    if (merge != nullptr) {
      heap_.push_back({merge->rank, position, symbols[position], symbols[right], merge->merged});
      std::push_heap(heap_.begin(), heap_.end(), later);
    }
  };
  heap_.clear();
  for (int32_t i = 0; i + 1 < size; ++i) candidate(i);
  std::vector<int32_t>& touched = touched_;
  while (!heap_.empty()) {
    const int32_t rank = heap_.front().rank;
    batch_.clear();
    while (!heap_.empty() && heap_.front().rank == rank) {
      std::pop_heap(heap_.begin(), heap_.end(), later);
      batch_.push_back(heap_.back());
      heap_.pop_back();
    }
    touched.clear();
    for (const HeapEntry& entry : batch_) {  // increasing position
      const int32_t p = entry.position;
      const int32_t q = next_[p];
      if (symbols[p] != entry.left || q < 0 || symbols[q] != entry.right) continue;
      symbols[p] = entry.merged;
      symbols[q] = -1;
      next_[p] = next_[q];
      if (next_[q] >= 0) previous_[next_[q]] = p;
      if (previous_[p] >= 0 && (touched.empty() || touched.back() != previous_[p])) {
        touched.push_back(previous_[p]);
      }
      touched.push_back(p);
    }
    for (const int32_t position : touched) candidate(position);
  }
  int32_t out = 0;
  for (int32_t i = 0; i >= 0; i = next_[i]) symbols[out++] = symbols[i];
  symbols.resize(out);
}

}  // namespace backend
