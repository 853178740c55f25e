// NullTokenizer: ids written as decimal integers (rules and the comparison with Megatron's
// _NullTokenizer in null_tokenizer.hpp).
#include "backend/data/null_tokenizer.hpp"

#include <fmt/format.h>

#include <charconv>
#include <limits>
#include <string>

#include "backend/common/error.hpp"

namespace backend {

namespace {

// At most 40 bytes of a field for a message, cut at a UTF-8 character boundary, with control
// bytes written \xNN: the text is user data and must not steer the terminal or cut the log line.
std::string quotable(std::string_view field) {
  constexpr size_t kShown = 40;
  if (field.size() > kShown) {
    size_t cut = kShown;
    while (cut > 0 && (static_cast<unsigned char>(field[cut]) & 0xC0) == 0x80) --cut;
    field = field.substr(0, cut);
  }
  std::string text;
  for (const char c : field) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte < 0x20 || byte == 0x7F) {
      text += fmt::format("\\x{:02x}", byte);
    } else {
      text += c;
    }
  }
  return text;
}

}  // namespace

NullTokenizer::NullTokenizer(int64_t vocab_size) : vocab_size_without_eod_(vocab_size) {
  if (vocab_size <= 0 || vocab_size >= std::numeric_limits<int32_t>::max()) {
    common::fail("--tokenizer-type NullTokenizer needs --vocab-size N with 0 < N < 2^31 − 1, "
                 "got {}", vocab_size);
  }
}

void NullTokenizer::tokenize(std::string_view text, std::vector<int32_t>& ids) {
  const auto is_space = [](char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
  };
  size_t field_number = 0;
  for (size_t i = 0; i < text.size();) {
    while (i < text.size() && is_space(text[i])) ++i;
    const size_t start = i;
    while (i < text.size() && !is_space(text[i])) ++i;
    if (i == start) break;
    ++field_number;
    std::string_view field = text.substr(start, i - start);
    std::string_view digits = field.starts_with('+') ? field.substr(1) : field;
    int64_t id = -1;
    const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), id);
    const bool all_digits = !digits.empty() && digits.front() != '-' &&
                            end == digits.data() + digits.size();
    if (!all_digits || error != std::errc() || id > vocab_size_without_eod_) {
      common::fail("NullTokenizer: field {} of the text, \"{}\", is not a token id in [0, {}] "
                   "(the text must be decimal ids separated by spaces; {} is the end of "
                   "document)", field_number, quotable(field), vocab_size_without_eod_,
                   vocab_size_without_eod_);
    }
    ids.push_back(static_cast<int32_t>(id));
  }
}

std::string NullTokenizer::detokenize(std::span<const int32_t> ids) const {
  std::string text;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] > vocab_size_without_eod_) {
      common::fail("detokenize: id {} is outside the NullTokenizer vocabulary [0, {}]", ids[i],
                   vocab_size_without_eod_);
    }
    if (i > 0) text += ' ';
    text += std::to_string(ids[i]);
  }
  return text;
}

std::unique_ptr<Tokenizer> NullTokenizer::clone() const {
  return std::make_unique<NullTokenizer>(*this);
}

}  // namespace backend
