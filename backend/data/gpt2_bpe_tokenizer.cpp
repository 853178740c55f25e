// GPT-2 byte-level BPE: loading vocab.json/merges.txt, the pre-tokenization scanner, the two
// merge loops and the word cache (the rules and their sources are in gpt2_bpe_tokenizer.hpp).
#include "backend/data/gpt2_bpe_tokenizer.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cstring>
#include <iterator>
#include <limits>
#include <unordered_map>

#include "backend/common/error.hpp"
#include "backend/common/modular_arithmetic.hpp"
#include "backend/common/small_file.hpp"
#include "backend/common/splitmix64.hpp"
#include "backend/data/unicode_text.hpp"

namespace backend {
namespace {

// ---- GPT-2's byte ↔ character mapping (encoder.py's bytes_to_unicode): the 188 printable
// bytes '!'..'~', '¡'..'¬', '®'..'ÿ' stand for themselves, the other 68 bytes (controls,
// space, DEL, NBSP, soft hyphen, ...) take U+0100.. U+0143 in byte order, so every vocabulary
// entry is printable text.
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

// A vocabulary or merges token (text in GPT-2's byte characters) → the bytes it stands for.
// False, with `bad` set to the first character that is not a byte character, if there is one.
bool token_text_to_bytes(std::string_view text, std::string& bytes, char32_t& bad) {
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

// 1-based line and column of byte `offset` in `text`.
std::pair<size_t, size_t> line_and_column(std::string_view text, size_t offset) {
  offset = std::min(offset, text.size());
  const size_t line = 1 + static_cast<size_t>(std::count(text.begin(), text.begin() + offset, '\n'));
  const size_t line_start = text.rfind('\n', offset == 0 ? 0 : offset - 1);
  const size_t column = line_start == std::string_view::npos || offset == 0
                            ? offset + 1
                            : offset - line_start;
  return {line, column};
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

// ---- the pre-tokenizer: the end of the piece that starts at p (p < end), following the
// pattern's alternatives in order with the `regex` module's greedy, backtracking semantics.
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

const unsigned char* piece_end(const CharacterClasses& classes, const unsigned char* p,
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
  if (run_class != CharacterClass::whitespace) {
    while (q < end && class_at(classes, q, length) == run_class) q += length;
    return q;
  }
  // '\s+(?!\S)|\s+': the whole run when it ends the text; otherwise the run but its last
  // character (which then starts the next piece), or the single character of a run of one.
  const unsigned char* last_start = p;
  int count = 1;
  while (q < end && class_at(classes, q, length) == CharacterClass::whitespace) {
    last_start = q;
    q += length;
    ++count;
  }
  if (q == end || count == 1) return q;
  return last_start;
}

template <typename Emit>
void for_each_piece(const CharacterClasses& classes, std::string_view text, Emit&& emit) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const auto* end = p + text.size();
  while (p < end) {
    const unsigned char* piece_stop = piece_end(classes, p, end);
    emit(std::string_view(reinterpret_cast<const char*>(p), static_cast<size_t>(piece_stop - p)));
    p = piece_stop;
  }
}

}  // namespace

// ---- read-only tables shared by clones
struct Gpt2BpeTokenizer::Tables {
  struct Merge {
    uint64_t pair = kEmpty;  // left id << 32 | right id
    int32_t rank = 0;
    int32_t merged = 0;
  };
  static constexpr uint64_t kEmpty = std::numeric_limits<uint64_t>::max();

  int64_t vocab_size = 0;
  int32_t eod = 0;
  std::array<int32_t, 256> byte_token{};
  std::vector<uint32_t> token_offsets;  // bytes of id i: token_bytes[offsets[i], offsets[i+1])
  std::string token_bytes;
  std::vector<Merge> merges;  // open addressing, power-of-two size
  uint64_t merge_mask = 0;
  CharacterClasses classes;

  static uint64_t pair_key(int32_t left, int32_t right) {
    return (uint64_t(uint32_t(left)) << 32) | uint32_t(right);
  }

  const Merge* find_merge(int32_t left, int32_t right) const {
    const uint64_t key = pair_key(left, right);
    for (uint64_t slot = common::splitmix64_mix(key) & merge_mask;;
         slot = (slot + 1) & merge_mask) {
      const Merge& merge = merges[slot];
      if (merge.pair == key) return &merge;
      if (merge.pair == kEmpty) return nullptr;
    }
  }

  // Inserts or, like Python's dict(zip(merges, ranks)), overwrites with the later rank.
  void set_merge(int32_t left, int32_t right, int32_t rank, int32_t merged) {
    const uint64_t key = pair_key(left, right);
    for (uint64_t slot = common::splitmix64_mix(key) & merge_mask;;
         slot = (slot + 1) & merge_mask) {
      Merge& merge = merges[slot];
      if (merge.pair == key || merge.pair == kEmpty) {
        merge = {key, rank, merged};
        return;
      }
    }
  }
};

namespace {

std::shared_ptr<Gpt2BpeTokenizer::Tables> load_tables(const std::filesystem::path& vocab_file,
                                                      const std::filesystem::path& merge_file) {
  auto tables = std::make_shared<Gpt2BpeTokenizer::Tables>();
  const std::string vocab_name = vocab_file.string(), merge_name = merge_file.string();

  // ---- vocab.json: {"token": id, ...}, ids 0 .. N−1
  const std::string vocab_text = common::read_small_file(vocab_file, "--vocab-file");
  nlohmann::json vocab;
  try {
    vocab = nlohmann::json::parse(vocab_text);
  } catch (const nlohmann::json::parse_error& error) {
    const auto [line, column] = line_and_column(vocab_text, error.byte == 0 ? 0 : error.byte - 1);
    std::string reason = error.what();
    if (const size_t colon = reason.rfind(": "); colon != std::string::npos) {
      reason = reason.substr(colon + 2);
    }
    common::fail("{}:{}:{}: --vocab-file is not valid JSON ({})", vocab_name, line, column, reason);
  } catch (const nlohmann::json::exception& error) {
    // Valid syntax nlohmann still refuses, such as a number beyond a double (1e999).
    std::string reason = error.what();
    if (const size_t bracket = reason.find("] "); bracket != std::string::npos) {
      reason = reason.substr(bracket + 2);
    }
    common::fail("{}: --vocab-file is not valid JSON ({})", vocab_name, reason);
  }
  if (!vocab.is_object() || vocab.empty()) {
    common::fail("{}: --vocab-file must be a JSON object of token → id (GPT-2's vocab.json), "
                 "found {}", vocab_name, vocab.is_object() ? "an empty object" : vocab.type_name());
  }
  const size_t count = vocab.size();
  if (count > size_t(std::numeric_limits<int32_t>::max())) {
    common::fail("{}: {} tokens is more than 32-bit ids hold", vocab_name, count);
  }
  std::vector<std::string> bytes_of_id(count);
  std::vector<bool> seen(count, false);
  std::unordered_map<std::string, int32_t> id_of_bytes;
  id_of_bytes.reserve(count * 2);
  std::string bytes;
  bool has_eod = false;
  for (const auto& [token, value] : vocab.items()) {
    if (!value.is_number_integer() || value.get<int64_t>() < 0 ||
        value.get<int64_t>() >= static_cast<int64_t>(count)) {
      common::fail("{}: token {} has id {}; ids must be the integers 0 .. {} (one per token)",
                   vocab_name, nlohmann::json(token).dump(), value.dump(), count - 1);
    }
    const auto id = static_cast<int32_t>(value.get<int64_t>());
    if (seen[id]) {
      common::fail("{}: id {} is given to two tokens (the second is {})", vocab_name, id,
                   nlohmann::json(token).dump());
    }
    seen[id] = true;
    if (char32_t bad = 0; !token_text_to_bytes(token, bytes, bad)) {
      common::fail("{}: token {} contains U+{:04X}, which is not one of GPT-2's 256 byte "
                   "characters", vocab_name, nlohmann::json(token).dump(), uint32_t(bad));
    }
    if (token == "<|endoftext|>") {
      tables->eod = id;
      has_eod = true;
    }
    if (!id_of_bytes.emplace(bytes, id).second) {
      common::fail("{}: token {} appears twice", vocab_name, nlohmann::json(token).dump());
    }
    bytes_of_id[id] = bytes;
  }
  if (!has_eod) {
    common::fail("{}: no \"<|endoftext|>\" token, which GPT2BPETokenizer uses as the end of "
                 "document", vocab_name);
  }
  tables->vocab_size = static_cast<int64_t>(count);
  tables->token_offsets.reserve(count + 1);
  tables->token_offsets.push_back(0);
  for (const std::string& token : bytes_of_id) {
    tables->token_bytes += token;
    tables->token_offsets.push_back(static_cast<uint32_t>(tables->token_bytes.size()));
  }
  for (int b = 0; b < 256; ++b) {
    const auto found = id_of_bytes.find(std::string(1, static_cast<char>(b)));
    if (found == id_of_bytes.end()) {
      common::fail("{}: no token for byte 0x{:02X} (U+{:04X}); a byte-level BPE vocabulary "
                   "has one for each of the 256 bytes", vocab_name, b,
                   uint32_t(byte_characters().of_byte[b]));
    }
    tables->byte_token[b] = found->second;
  }

  // ---- merges.txt: "#version" line, then "left right" per line, best first
  const std::string merge_text = common::read_small_file(merge_file, "--merge-file");
  std::vector<std::array<int32_t, 3>> merges;  // left, right, merged
  size_t line_number = 0;
  std::string left_bytes, right_bytes;
  for (size_t start = 0; start < merge_text.size();) {
    size_t stop = merge_text.find('\n', start);
    if (stop == std::string::npos) stop = merge_text.size();
    const std::string_view line(merge_text.data() + start, stop - start);
    start = stop + 1;
    ++line_number;
    if (line_number == 1 && line.starts_with('#')) continue;  // "#version: 0.2"
    std::vector<std::string_view> fields;
    for (size_t i = 0; i < line.size();) {
      const auto is_space = [](char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f'; };
      while (i < line.size() && is_space(line[i])) ++i;
      const size_t field_start = i;
      while (i < line.size() && !is_space(line[i])) ++i;
      if (i > field_start) fields.push_back(line.substr(field_start, i - field_start));
    }
    if (fields.empty()) continue;
    if (fields.size() != 2) {
      common::fail("{}:{}: a merge is two tokens separated by a space, found {} field{}: {}",
                   merge_name, line_number, fields.size(), fields.size() == 1 ? "" : "s",
                   nlohmann::json(std::string(line)).dump(
                       -1, ' ', false, nlohmann::json::error_handler_t::replace));
    }
    if (!is_valid_utf8(line)) common::fail("{}:{}: not valid UTF-8", merge_name, line_number);
    std::array<int32_t, 3> merge{};
    std::string* parts[2] = {&left_bytes, &right_bytes};
    for (int k = 0; k < 2; ++k) {
      if (char32_t bad = 0; !token_text_to_bytes(fields[k], *parts[k], bad)) {
        common::fail("{}:{}: token \"{}\" contains U+{:04X}, which is not one of GPT-2's 256 "
                     "byte characters", merge_name, line_number, fields[k], uint32_t(bad));
      }
      const auto found = id_of_bytes.find(*parts[k]);
      if (found == id_of_bytes.end()) {
        common::fail("{}:{}: token \"{}\" is not in the vocabulary {}", merge_name, line_number,
                     fields[k], vocab_name);
      }
      merge[k] = found->second;
    }
    const auto merged = id_of_bytes.find(left_bytes + right_bytes);
    if (merged == id_of_bytes.end()) {
      common::fail("{}:{}: the merged token \"{}{}\" is not in the vocabulary {}", merge_name,
                   line_number, fields[0], fields[1], vocab_name);
    }
    merge[2] = merged->second;
    merges.push_back(merge);
  }
  if (merges.size() > size_t(std::numeric_limits<int32_t>::max())) {
    common::fail("{}: too many merges", merge_name);
  }
  size_t slots = 16;
  while (slots < merges.size() * 2) slots *= 2;
  tables->merges.assign(slots, {});
  tables->merge_mask = slots - 1;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    tables->set_merge(merges[rank][0], merges[rank][1], static_cast<int32_t>(rank),
                      merges[rank][2]);
  }
  return tables;
}

constexpr size_t kMaxCachedPieceBytes = 255;

}  // namespace

// ---- the word cache: piece bytes → ids in one open-addressing table over two arenas.
// Emptied (not evicted piecemeal) when it reaches its entry limit: real text's frequent
// pieces come back within a few thousand words, and a flat table with no per-entry
// allocation is what keeps a hit cheaper than the scanner that found the piece.
class Gpt2BpeTokenizer::WordCache {
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

Gpt2BpeTokenizer::Gpt2BpeTokenizer(const std::filesystem::path& vocab_file,
                                   const std::filesystem::path& merge_file,
                                   Gpt2BpeOptions options)
    : tables_(load_tables(vocab_file, merge_file)), options_(options) {
  if (options_.word_cache_entries < 0 || options_.heap_merge_min_bytes < 0) {
    common::fail("Gpt2BpeOptions: word_cache_entries and heap_merge_min_bytes must be ≥ 0");
  }
  if (options_.word_cache_entries > 0) {
    cache_ = std::make_unique<WordCache>(options_.word_cache_entries);
  }
}

Gpt2BpeTokenizer::Gpt2BpeTokenizer(const Gpt2BpeTokenizer& other)
    : tables_(other.tables_), options_(other.options_) {
  if (options_.word_cache_entries > 0) {
    cache_ = std::make_unique<WordCache>(options_.word_cache_entries);
  }
}

Gpt2BpeTokenizer::~Gpt2BpeTokenizer() = default;

int64_t Gpt2BpeTokenizer::vocab_size() const { return tables_->vocab_size; }
int32_t Gpt2BpeTokenizer::eod() const { return tables_->eod; }

std::unique_ptr<Tokenizer> Gpt2BpeTokenizer::clone() const {
  return std::make_unique<Gpt2BpeTokenizer>(*this);
}

void Gpt2BpeTokenizer::tokenize(std::string_view text, std::vector<int32_t>& ids) {
  if (!is_valid_utf8(text)) {
    replace_invalid_utf8(text, repaired_text_);
    text = repaired_text_;
  }
  for_each_piece(tables_->classes, text, [&](std::string_view piece) { encode_piece(piece, ids); });
}

std::vector<std::string_view> Gpt2BpeTokenizer::pretokenize(std::string_view text) const {
  if (!is_valid_utf8(text)) common::fail("pretokenize: the text is not valid UTF-8");
  std::vector<std::string_view> pieces;
  for_each_piece(tables_->classes, text, [&](std::string_view piece) { pieces.push_back(piece); });
  return pieces;
}

void Gpt2BpeTokenizer::encode_piece(std::string_view piece, std::vector<int32_t>& ids) {
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
void Gpt2BpeTokenizer::merge_by_scan(std::vector<int32_t>& symbols) const {
  size_t size = symbols.size();
  while (size > 1) {
    const Tables::Merge* best = nullptr;
    for (size_t i = 0; i + 1 < size; ++i) {
      const Tables::Merge* merge = tables_->find_merge(symbols[i], symbols[i + 1]);
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
void Gpt2BpeTokenizer::merge_by_heap(std::vector<int32_t>& symbols) {
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
    const Tables::Merge* merge = tables_->find_merge(symbols[position], symbols[right]);
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

std::string Gpt2BpeTokenizer::detokenize(std::span<const int32_t> ids) const {
  std::string bytes;
  for (const int32_t id : ids) {
    if (id < 0 || id >= tables_->vocab_size) {
      common::fail("detokenize: id {} is outside the GPT-2 vocabulary [0, {})", id,
                   tables_->vocab_size);
    }
    bytes.append(tables_->token_bytes, tables_->token_offsets[id],
                 tables_->token_offsets[id + 1] - tables_->token_offsets[id]);
  }
  return bytes;
}

}  // namespace backend
