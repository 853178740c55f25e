// GPT-2 byte-level BPE: loading vocab.json/merges.txt into the shared byte-level BPE tables
// (byte_level_bpe.hpp); the rules and their sources are in gpt2_bpe_tokenizer.hpp.
#include "backend/data/gpt2_bpe_tokenizer.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <limits>
#include <unordered_map>

#include "backend/common/error.hpp"
#include "backend/common/small_file.hpp"
#include "backend/data/unicode_text.hpp"

namespace backend {
namespace {

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

std::shared_ptr<ByteLevelBpeTables> load_tables(const std::filesystem::path& vocab_file,
                                               const std::filesystem::path& merge_file,
                                               int32_t& eod) {
  auto tables = std::make_shared<ByteLevelBpeTables>();
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
    if (char32_t bad = 0; !byte_level_text_to_bytes(token, bytes, bad)) {
      common::fail("{}: token {} contains U+{:04X}, which is not one of GPT-2's 256 byte "
                   "characters", vocab_name, nlohmann::json(token).dump(), uint32_t(bad));
    }
    if (token == "<|endoftext|>") {
      eod = id;
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
  tables->set_tokens(bytes_of_id);
  for (int b = 0; b < 256; ++b) {
    const auto found = id_of_bytes.find(std::string(1, static_cast<char>(b)));
    if (found == id_of_bytes.end()) {
      common::fail("{}: no token for byte 0x{:02X} (U+{:04X}); a byte-level BPE vocabulary "
                   "has one for each of the 256 bytes", vocab_name, b,
                   uint32_t(byte_level_character(static_cast<uint8_t>(b))));
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
      if (char32_t bad = 0; !byte_level_text_to_bytes(fields[k], *parts[k], bad)) {
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
  tables->set_merges(merges);
  return tables;
}

}  // namespace

Gpt2BpeTokenizer::Gpt2BpeTokenizer(const std::filesystem::path& vocab_file,
                                   const std::filesystem::path& merge_file,
                                   Gpt2BpeOptions options)
    : tables_(load_tables(vocab_file, merge_file, eod_)), encoder_(tables_, options) {}

Gpt2BpeTokenizer::Gpt2BpeTokenizer(const Gpt2BpeTokenizer& other)
    : eod_(other.eod_), tables_(other.tables_), encoder_(other.encoder_) {}

Gpt2BpeTokenizer::~Gpt2BpeTokenizer() = default;

int64_t Gpt2BpeTokenizer::vocab_size() const { return tables_->vocab_size; }
int32_t Gpt2BpeTokenizer::eod() const { return eod_; }

std::unique_ptr<Tokenizer> Gpt2BpeTokenizer::clone() const {
  return std::make_unique<Gpt2BpeTokenizer>(*this);
}

void Gpt2BpeTokenizer::tokenize(std::string_view text, std::vector<int32_t>& ids) {
  if (!is_valid_utf8(text)) {
    replace_invalid_utf8(text, repaired_text_);
    text = repaired_text_;
  }
  encoder_.encode(text, ids);
}

std::vector<std::string_view> Gpt2BpeTokenizer::pretokenize(std::string_view text) const {
  if (!is_valid_utf8(text)) common::fail("pretokenize: the text is not valid UTF-8");
  return encoder_.pretokenize(text);
}

std::string Gpt2BpeTokenizer::detokenize(std::span<const int32_t> ids) const {
  std::string bytes;
  for (const int32_t id : ids) {
    if (id < 0 || id >= tables_->vocab_size) {
      common::fail("detokenize: id {} is outside the GPT-2 vocabulary [0, {})", id,
                   tables_->vocab_size);
    }
    bytes.append(tables_->bytes_of(id));
  }
  return bytes;
}

}  // namespace backend
