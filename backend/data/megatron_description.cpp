// Python's json.dumps(indent=4) and Megatron's legacy tokenizer identifiers; see
// megatron_description.hpp.
#include "backend/data/megatron_description.hpp"

#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <system_error>

#include "backend/common/error.hpp"

namespace backend {

namespace {

// The length of the valid UTF-8 sequence at text[i] (1 to 4), or 0 when the bytes there are not
// one: no overlong forms, no surrogates, nothing above U+10FFFF (Python's decoder's rules).
size_t utf8_sequence(std::string_view text, size_t i, char32_t& code_point) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char lead = byte(i);
  if (lead < 0x80) {
    code_point = lead;
    return 1;
  }
  size_t length = 0;
  char32_t value = 0;
  char32_t lowest = 0;
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2, value = lead & 0x1F, lowest = 0x80;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3, value = lead & 0x0F, lowest = 0x800;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4, value = lead & 0x07, lowest = 0x10000;
  } else {
    return 0;
  }
  if (i + length > text.size()) return 0;
  for (size_t k = 1; k < length; ++k) {
    if ((byte(i + k) & 0xC0) != 0x80) return 0;
    value = (value << 6) | (byte(i + k) & 0x3F);
  }
  if (value < lowest || value > 0x10FFFF || (value >= 0xD800 && value <= 0xDFFF)) return 0;
  code_point = value;
  return length;
}

void append_string(std::string& out, std::string_view text) {
  out += '"';
  for (size_t i = 0; i < text.size();) {
    char32_t code_point = 0;
    const size_t length = utf8_sequence(text, i, code_point);
    if (length == 0) {
      // surrogateescape: the byte b becomes U+DC00 + b, which ensure_ascii writes as \udcXX.
      out += fmt::format("\\u{:04x}", 0xDC00 + static_cast<unsigned char>(text[i]));
      ++i;
      continue;
    }
    i += length;
    switch (code_point) {
      case '"': out += "\\\""; continue;
      case '\\': out += "\\\\"; continue;
      case '\b': out += "\\b"; continue;
      case '\f': out += "\\f"; continue;
      case '\n': out += "\\n"; continue;
      case '\r': out += "\\r"; continue;
      case '\t': out += "\\t"; continue;
      default: break;
    }
    if (code_point >= 0x20 && code_point < 0x7F) {
      out += static_cast<char>(code_point);
    } else if (code_point < 0x10000) {
      out += fmt::format("\\u{:04x}", static_cast<uint32_t>(code_point));
    } else {
      const uint32_t offset = static_cast<uint32_t>(code_point) - 0x10000;
      out += fmt::format("\\u{:04x}\\u{:04x}", 0xD800 + (offset >> 10), 0xDC00 + (offset & 0x3FF));
    }
  }
  out += '"';
}

// float.__repr__: the shortest round-tripping digits (what std::to_chars finds), laid out by
// Python's rule (float_repr_style "short", format code 'r' with Py_DTSF_ADD_DOT_0).
void append_float(std::string& out, double value) {
  if (std::isnan(value)) {
    out += "NaN";  // json.dumps writes these (allow_nan); a description never holds one
    return;
  }
  if (std::isinf(value)) {
    out += value > 0 ? "Infinity" : "-Infinity";
    return;
  }
  char buffer[64];
  const auto result = std::to_chars(buffer, buffer + sizeof buffer, value, std::chars_format::scientific);
  if (result.ec != std::errc()) common::fail("internal: cannot format the double {}", value);
  const std::string_view scientific(buffer, static_cast<size_t>(result.ptr - buffer));
  // "-d.ddde±XX": the sign, the digits without the point, the decimal exponent.
  const size_t e = scientific.find('e');
  std::string_view mantissa = scientific.substr(0, e);
  const bool negative = mantissa.starts_with('-');
  if (negative) mantissa.remove_prefix(1);
  std::string digits;
  for (char c : mantissa) {
    if (c != '.') digits += c;
  }
  const int exponent = std::atoi(std::string(scientific.substr(e + 1)).c_str());
  if (negative) out += '-';
  if (exponent < -4 || exponent >= 16) {
    out += digits[0];
    if (digits.size() > 1) {
      out += '.';
      out.append(digits, 1);
    }
    out += fmt::format("e{}{:02d}", exponent < 0 ? '-' : '+', std::abs(exponent));
  } else if (exponent < 0) {
    out += "0.";
    out.append(static_cast<size_t>(-exponent - 1), '0');
    out += digits;
  } else {
    const size_t integral = static_cast<size_t>(exponent) + 1;
    if (digits.size() <= integral) {
      out += digits;
      out.append(integral - digits.size(), '0');
      out += ".0";
    } else {
      out.append(digits, 0, integral);
      out += '.';
      out.append(digits, integral);
    }
  }
}

void append_value(std::string& out, const nlohmann::ordered_json& value, int level) {
  const auto newline = [&](int depth) {
    out += '\n';
    out.append(static_cast<size_t>(4 * depth), ' ');
  };
  switch (value.type()) {
    case nlohmann::ordered_json::value_t::null: out += "null"; return;
    case nlohmann::ordered_json::value_t::boolean: out += value.get<bool>() ? "true" : "false"; return;
    case nlohmann::ordered_json::value_t::number_integer: out += fmt::format("{}", value.get<int64_t>()); return;
    case nlohmann::ordered_json::value_t::number_unsigned: out += fmt::format("{}", value.get<uint64_t>()); return;
    case nlohmann::ordered_json::value_t::number_float: append_float(out, value.get<double>()); return;
    case nlohmann::ordered_json::value_t::string: append_string(out, value.get_ref<const std::string&>()); return;
    case nlohmann::ordered_json::value_t::array: {
      if (value.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      bool first = true;
      for (const auto& element : value) {
        if (!first) out += ',';
        first = false;
        newline(level + 1);
        append_value(out, element, level + 1);
      }
      newline(level);
      out += ']';
      return;
    }
    case nlohmann::ordered_json::value_t::object: {
      if (value.empty()) {
        out += "{}";
        return;
      }
      out += '{';
      bool first = true;
      for (const auto& [key, element] : value.items()) {
        if (!first) out += ',';
        first = false;
        newline(level + 1);
        append_string(out, key);
        out += ": ";
        append_value(out, element, level + 1);
      }
      newline(level);
      out += '}';
      return;
    }
    default: common::fail("internal: a dataset description holds a value JSON cannot write");
  }
}

}  // namespace

std::string python_json_text(const nlohmann::ordered_json& value) {
  std::string out;
  append_value(out, value, 0);
  return out;
}

nlohmann::ordered_json megatron_tokenizer_identifiers(const TokenizerOptions& options) {
  const std::string& type = options.tokenizer_type;
  nlohmann::ordered_json identifiers;
  if (type == "GPT2BPETokenizer") {
    identifiers["class"] = "_GPT2BPETokenizer";
    identifiers["tokenizer_path"] = nlohmann::ordered_json::array({options.vocab_file, options.merge_file});
  } else if (type == "NullTokenizer") {
    identifiers["class"] = "_NullTokenizer";
    identifiers["tokenizer_path"] = nlohmann::ordered_json::array({nullptr});
    identifiers["vocab_size"] = std::to_string(options.vocab_size);
  } else if (type == "SentencePieceTokenizer" || type == "GPTSentencePieceTokenizer" ||
             type == "Llama2Tokenizer") {
    identifiers["class"] = "_" + type;
    identifiers["tokenizer_path"] = nlohmann::ordered_json::array({options.tokenizer_model});
    // The GPT and Llama 2 variants pass vocab_extra_ids=0 to their base class whatever the flag.
    identifiers["vocab_extra_ids"] =
        std::to_string(type == "SentencePieceTokenizer" ? options.vocab_extra_ids : 0);
  } else {
    common::fail("--tokenizer-type {}: no dataset description for it; the types are "
                 "GPT2BPETokenizer, NullTokenizer, SentencePieceTokenizer, "
                 "GPTSentencePieceTokenizer and Llama2Tokenizer", type);
  }
  return identifiers;
}

}  // namespace backend
