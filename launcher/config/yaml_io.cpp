// YAML reading (yaml-cpp events -> Node, with OmegaConf 2.2's scalar typing) and block-style
// writing; see yaml_io.hpp. The implicit-resolver patterns are PyYAML's
// (yaml/resolver.py, YAML 1.1) plus OmegaConf's float pattern; construction follows
// PyYAML's SafeConstructor (construct_yaml_int / construct_yaml_float).
#include "launcher/config/yaml_io.hpp"

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/exceptions.h>
#include <yaml-cpp/mark.h>
#include <yaml-cpp/parser.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <sstream>

#include "backend/common/error.hpp"
#include "backend/common/small_file.hpp"
#include "backend/common/utf8.hpp"

namespace launcher {

namespace {

// ---- scalar typing: hand-written matchers for the resolver patterns, each over the whole text

bool is_digit(char character) {
  return character >= '0' && character <= '9';
}

// A cursor over the text; each matcher consumes and reports whether it matched.
class Cursor {
 public:
  explicit Cursor(std::string_view text) : text_(text) {}
  bool done() const { return position_ == text_.size(); }
  char peek() const { return done() ? '\0' : text_[position_]; }
  bool accept(char character) {
    if (peek() != character || done()) return false;
    ++position_;
    return true;
  }
  bool accept_one_of(std::string_view characters) {
    if (done() || characters.find(peek()) == std::string_view::npos) return false;
    ++position_;
    return true;
  }
  // Consumes characters while `predicate` holds; returns how many.
  template <typename Predicate>
  std::size_t accept_while(Predicate predicate) {
    std::size_t count = 0;
    while (!done() && predicate(peek())) {
      ++position_;
      ++count;
    }
    return count;
  }
  void optional_sign() { accept_one_of("+-"); }

 private:
  std::string_view text_;
  std::size_t position_ = 0;
};

bool digit_or_underscore(char character) {
  return is_digit(character) || character == '_';
}

// [0-9][0-9_]*
bool accept_digit_run(Cursor& cursor) {
  if (!is_digit(cursor.peek()) || cursor.done()) return false;
  cursor.accept_while(digit_or_underscore);
  return true;
}

// (?::[0-5]?[0-9])+  — the base-60 groups of YAML 1.1
bool accept_sexagesimal_groups(Cursor& cursor) {
  std::size_t groups = 0;
  while (cursor.accept(':')) {
    // [0-5]?[0-9]: one digit, or two with the first in 0-5.
    const char first = cursor.peek();
    const std::size_t digits = cursor.accept_while(is_digit);
    if (digits == 0 || digits > 2 || (digits == 2 && first > '5')) return false;
    ++groups;
  }
  return groups > 0;
}

// [eE][-+]?[0-9]+ (sign_required: [eE][-+][0-9]+)
bool accept_exponent(Cursor& cursor, bool sign_required) {
  if (!cursor.accept_one_of("eE")) return false;
  if (!cursor.accept_one_of("+-") && sign_required) return false;
  return cursor.accept_while(is_digit) > 0;
}

bool matches_null(std::string_view text) {
  return text.empty() || text == "~" || text == "null" || text == "Null" || text == "NULL";
}

std::optional<bool> match_bool(std::string_view text) {
  static constexpr std::string_view kTrue[] = {"yes",  "Yes", "YES", "true", "True",
                                               "TRUE", "on",  "On",  "ON"};
  static constexpr std::string_view kFalse[] = {"no",    "No",  "NO",  "false", "False",
                                                "FALSE", "off", "Off", "OFF"};
  for (auto word : kTrue) {
    if (text == word) return true;
  }
  for (auto word : kFalse) {
    if (text == word) return false;
  }
  return std::nullopt;
}

bool matches_int(std::string_view text) {
  {  // [-+]?0b[0-1_]+
    Cursor cursor(text);
    cursor.optional_sign();
    if (cursor.accept('0') && cursor.accept('b') &&
        cursor.accept_while([](char c) { return c == '0' || c == '1' || c == '_'; }) > 0 &&
        cursor.done()) {
      return true;
    }
  }
  {  // [-+]?0[0-7_]+
    Cursor cursor(text);
    cursor.optional_sign();
    if (cursor.accept('0') &&
        cursor.accept_while([](char c) { return (c >= '0' && c <= '7') || c == '_'; }) > 0 &&
        cursor.done()) {
      return true;
    }
  }
  {  // [-+]?(?:0|[1-9][0-9_]*)
    Cursor cursor(text);
    cursor.optional_sign();
    if (cursor.accept('0')) {
      if (cursor.done()) return true;
    } else if (cursor.peek() >= '1' && cursor.peek() <= '9' && accept_digit_run(cursor) &&
               cursor.done()) {
      return true;
    }
  }
  {  // [-+]?0x[0-9a-fA-F_]+
    Cursor cursor(text);
    cursor.optional_sign();
    if (cursor.accept('0') && cursor.accept('x') && cursor.accept_while([](char c) {
          return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F') || c == '_';
        }) > 0 &&
        cursor.done()) {
      return true;
    }
  }
  {  // [-+]?[1-9][0-9_]*(?::[0-5]?[0-9])+
    Cursor cursor(text);
    cursor.optional_sign();
    if (cursor.peek() >= '1' && cursor.peek() <= '9' && accept_digit_run(cursor) &&
        accept_sexagesimal_groups(cursor) && cursor.done()) {
      return true;
    }
  }
  return false;
}

bool matches_float(std::string_view text) {
  {  // [-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?   (OmegaConf; PyYAML's needs the sign)
    Cursor cursor(text);
    cursor.optional_sign();
    if (accept_digit_run(cursor) && cursor.accept('.')) {
      cursor.accept_while(digit_or_underscore);
      if (cursor.done()) return true;
      if (accept_exponent(cursor, false) && cursor.done()) return true;
    }
  }
  {  // [-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)   (OmegaConf's addition: 1e-5, 6E4)
    Cursor cursor(text);
    cursor.optional_sign();
    if (accept_digit_run(cursor) && accept_exponent(cursor, false) && cursor.done()) return true;
  }
  {  // \.[0-9_]+(?:[eE][-+][0-9]+)?
    Cursor cursor(text);
    if (cursor.accept('.') && cursor.accept_while(digit_or_underscore) > 0) {
      if (cursor.done()) return true;
      if (accept_exponent(cursor, true) && cursor.done()) return true;
    }
  }
  {  // [-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+\.[0-9_]*
    Cursor cursor(text);
    cursor.optional_sign();
    if (accept_digit_run(cursor) && accept_sexagesimal_groups(cursor) && cursor.accept('.')) {
      cursor.accept_while(digit_or_underscore);
      if (cursor.done()) return true;
    }
  }
  {  // [-+]?\.(?:inf|Inf|INF)  and  \.(?:nan|NaN|NAN)
    std::string_view rest = text;
    if (!rest.empty() && (rest[0] == '+' || rest[0] == '-')) rest.remove_prefix(1);
    if (rest == ".inf" || rest == ".Inf" || rest == ".INF") return true;
    if (text == ".nan" || text == ".NaN" || text == ".NAN") return true;
  }
  return false;
}

std::string without_underscores(std::string_view text) {
  std::string result;
  for (char character : text) {
    if (character != '_') result += character;
  }
  return result;
}

[[noreturn]] void fail_scalar(std::string_view text, std::string_view what,
                              const SourceLocation& location) {
  common::fail("{}: '{}' {}", location.describe(), text, what);
}

// The magnitude, unsigned: −2^63 (INT64_MIN) fits although 2^63 does not (construct_int).
std::uint64_t parse_integer_digits(std::string_view digits, int base, std::string_view text,
                                   const SourceLocation& location) {
  std::uint64_t value = 0;
  const auto [end, error] =
      std::from_chars(digits.data(), digits.data() + digits.size(), value, base);
  if (error == std::errc::result_out_of_range) {
    fail_scalar(text, "does not fit in a 64-bit integer", location);
  }
  if (error != std::errc() || end != digits.data() + digits.size() || digits.empty()) {
    fail_scalar(text, "is not a valid integer", location);
  }
  return value;
}

// PyYAML's construct_yaml_int.
std::int64_t construct_int(std::string_view text, const SourceLocation& location) {
  std::string value = without_underscores(text);
  std::int64_t sign = 1;
  if (!value.empty() && (value[0] == '-' || value[0] == '+')) {
    if (value[0] == '-') sign = -1;
    value.erase(0, 1);
  }
  std::string_view digits = value;
  std::uint64_t magnitude = 0;
  if (digits == "0") {
    magnitude = 0;
  } else if (digits.starts_with("0b")) {
    magnitude = parse_integer_digits(digits.substr(2), 2, text, location);
  } else if (digits.starts_with("0x")) {
    magnitude = parse_integer_digits(digits.substr(2), 16, text, location);
  } else if (!digits.empty() && digits[0] == '0') {
    magnitude = parse_integer_digits(digits, 8, text, location);
  } else if (digits.find(':') != std::string_view::npos) {
    // Python's integers have no limit; ours are int64, and a value past it is refused rather
    // than wrapped. The place value (60^k) may pass it while every later group is zero.
    std::uint64_t base = 1;
    bool base_fits = true;
    std::size_t end = digits.size();
    while (true) {
      const auto colon = digits.rfind(':', end - 1);
      const std::size_t start = colon == std::string_view::npos ? 0 : colon + 1;
      const std::uint64_t group =
          parse_integer_digits(digits.substr(start, end - start), 10, text, location);
      std::uint64_t term = 0;
      if (group != 0 && (!base_fits || __builtin_mul_overflow(group, base, &term) ||
                         __builtin_add_overflow(magnitude, term, &magnitude))) {
        fail_scalar(text, "does not fit in a 64-bit integer", location);
      }
      base_fits = base_fits && !__builtin_mul_overflow(base, 60, &base);
      if (colon == std::string_view::npos) break;
      end = colon;
    }
  } else {
    magnitude = parse_integer_digits(digits, 10, text, location);
  }
  constexpr std::uint64_t kLargest = std::numeric_limits<std::int64_t>::max();
  if (magnitude > kLargest + (sign < 0 ? 1 : 0)) {
    fail_scalar(text, "does not fit in a 64-bit integer", location);
  }
  if (sign > 0) return static_cast<std::int64_t>(magnitude);
  // −magnitude without overflow: −(m − 1) − 1 is −2^63 for m = 2^63.
  return magnitude == 0 ? 0 : -static_cast<std::int64_t>(magnitude - 1) - 1;
}

double parse_float_digits(std::string_view digits, std::string_view text,
                          const SourceLocation& location) {
  double value = 0;
  const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  if (error != std::errc() || end != digits.data() + digits.size()) {
    fail_scalar(text, "is not a valid float", location);
  }
  return value;
}

// PyYAML's construct_yaml_float.
double construct_float(std::string_view text, const SourceLocation& location) {
  std::string value = without_underscores(text);
  for (char& character : value) {
    if (character >= 'A' && character <= 'Z') character = static_cast<char>(character - 'A' + 'a');
  }
  double sign = 1;
  if (!value.empty() && (value[0] == '-' || value[0] == '+')) {
    if (value[0] == '-') sign = -1;
    value.erase(0, 1);
  }
  if (value == ".inf") return sign * std::numeric_limits<double>::infinity();
  if (value == ".nan") return std::numeric_limits<double>::quiet_NaN();
  if (value.find(':') != std::string::npos) {
    double result = 0;
    double base = 1;
    std::string_view digits = value;
    std::size_t end = digits.size();
    while (true) {
      const auto colon = digits.rfind(':', end - 1);
      const std::size_t start = colon == std::string_view::npos ? 0 : colon + 1;
      result += parse_float_digits(digits.substr(start, end - start), text, location) * base;
      base *= 60;
      if (colon == std::string_view::npos) break;
      end = colon;
    }
    return sign * result;
  }
  return sign * parse_float_digits(value, text, location);
}

// ---- reading: a yaml-cpp event handler that builds the Node tree

constexpr std::string_view kYamlTagPrefix = "tag:yaml.org,2002:";

// Aliases are expanded into copies; a document whose aliases refer to aliases (the "billion
// laughs") would grow exponentially. Real configs copy a few small anchors.
constexpr std::size_t kMaxAliasExpansion = 1'000'000;  // nodes, over the whole document

// The (line, column), both from 1, of a byte offset; columns count bytes.
std::pair<std::size_t, std::size_t> line_and_column(std::string_view text, std::size_t offset) {
  const std::string_view before = text.substr(0, offset);
  const std::size_t line_start = before.rfind('\n');
  const auto line = static_cast<std::size_t>(std::count(before.begin(), before.end(), '\n')) + 1;
  return {line, line_start == std::string_view::npos ? offset + 1 : offset - line_start};
}

// Hydra reads config files as UTF-8 and PyYAML refuses the C0 control characters (other than
// tab, line feed and carriage return) and DEL; yaml-cpp would take a NUL byte near the start
// for UTF-16 and misread the rest. Checked before parsing, naming the first offending byte.
void check_text_is_yaml(std::string_view text, std::string_view source_name) {
  if (const auto invalid = common::first_invalid_utf8(text)) {
    const auto [line, column] = line_and_column(text, *invalid);
    common::fail("{}:{}:{}: invalid UTF-8 (byte 0x{:02x}): config files must be UTF-8 text; "
                 "save it as UTF-8",
                 source_name, line, column, static_cast<unsigned char>(text[*invalid]));
  }
  for (std::size_t i = 0; i < text.size(); ++i) {
    const auto byte = static_cast<unsigned char>(text[i]);
    if ((byte < 0x20 && byte != '\t' && byte != '\n' && byte != '\r') || byte == 0x7f) {
      const auto [line, column] = line_and_column(text, i);
      common::fail("{}:{}:{}: control character 0x{:02x} is not allowed in YAML (write it as an "
                   "escape in a double-quoted string, e.g. \"\\x{:02x}\")",
                   source_name, line, column, byte, byte);
    }
  }
}

class TreeBuilder : public YAML::EventHandler {
 public:
  TreeBuilder(std::string source_name, std::string_view text)
      : source_name_(std::move(source_name)),
        text_(text),
        // yaml-cpp counts positions after a UTF-8 byte-order mark.
        position_offset_(text.starts_with("\xEF\xBB\xBF") ? 3 : 0) {}

  Node take_result() { return std::move(result_); }

  void OnDocumentStart(const YAML::Mark& mark) override {
    if (documents_ > 0) {
      fail_at(mark, "expected a single document in the stream, but found another document");
    }
    ++documents_;
  }
  void OnDocumentEnd() override {}

  void OnNull(const YAML::Mark& mark, YAML::anchor_t anchor) override {
    if (expecting_key()) fail_at(mark, "empty mapping keys are not supported");
    // An empty value: point at its key rather than wherever the parser stopped.
    SourceLocation location = locate(mark);
    if (!stack_.empty() && stack_.back().node.is_map() && stack_.back().pending_key) {
      location = stack_.back().pending_key_location;
    }
    complete(Node::null(std::move(location)), anchor, mark);
  }

  void OnAlias(const YAML::Mark& mark, YAML::anchor_t anchor) override {
    const auto found = anchors_.find(anchor);
    if (found == anchors_.end()) fail_at(mark, "alias to an anchor that is not defined");
    if (expecting_key()) fail_at(mark, "aliases used as mapping keys are not supported");
    alias_expansion_ += anchor_sizes_[anchor];
    if (alias_expansion_ > kMaxAliasExpansion) {
      fail_at(mark, fmt::format("the aliases of this document expand to more than {} values (do "
                                "aliases refer to anchors that hold aliases?)",
                                kMaxAliasExpansion));
    }
    complete(found->second, 0, mark);
  }

  void OnScalar(const YAML::Mark& mark, const std::string& tag, YAML::anchor_t anchor,
                const std::string& decoded) override {
    const std::string value = utf8_scalar(decoded, mark);
    SourceLocation location = locate(mark);
    if (tag != "?") check_quote_closed(mark);
    if (expecting_key()) {
      if (tag != "?" && tag != "!" && tag != std::string(kYamlTagPrefix) + "str") {
        fail_at(mark, fmt::format("unsupported tag '{}' on a mapping key", tag));
      }
      accept_key(value, tag == "?", mark);
      return;
    }
    complete(make_scalar(tag, value, location, mark), anchor, mark);
  }

  void OnSequenceStart(const YAML::Mark& mark, const std::string& tag, YAML::anchor_t anchor,
                       YAML::EmitterStyle::value /*style*/) override {
    check_collection_start(mark, tag, "seq");
    push_frame(Node::list(locate(mark)), anchor, mark);
  }
  void OnSequenceEnd() override { finish_collection(); }

  void OnMapStart(const YAML::Mark& mark, const std::string& tag, YAML::anchor_t anchor,
                  YAML::EmitterStyle::value /*style*/) override {
    check_collection_start(mark, tag, "map");
    push_frame(Node::map(locate(mark)), anchor, mark);
  }
  void OnMapEnd() override {
    Frame& frame = stack_.back();
    if (!frame.merged.empty()) {
      // PyYAML's flatten_mapping: merged pairs first, the mapping's own pairs override them.
      Node flattened = Node::map(frame.node.location());
      for (auto& entry : frame.merged) flattened.set(std::move(entry.key), std::move(entry.value));
      for (auto& entry : frame.node.entries()) flattened.set(entry.key, std::move(entry.value));
      frame.node = std::move(flattened);
    }
    finish_collection();
  }

 private:
  struct Frame {
    Node node;
    YAML::anchor_t anchor = 0;
    YAML::Mark mark;
    std::optional<std::string> pending_key;
    SourceLocation pending_key_location;
    bool pending_key_is_merge = false;
    std::map<std::string, int> key_lines;  // for duplicate-key errors
    std::vector<MapEntry> merged;          // pairs from `<<` merge keys, in PyYAML's order
  };

  void push_frame(Node node, YAML::anchor_t anchor, const YAML::Mark& mark) {
    if (stack_.size() >= kMaxYamlNesting) {
      fail_at(mark,
              fmt::format("more than {} levels of nested lists and mappings", kMaxYamlNesting));
    }
    Frame frame;
    frame.node = std::move(node);
    frame.anchor = anchor;
    frame.mark = mark;
    stack_.push_back(std::move(frame));
  }

  SourceLocation locate(const YAML::Mark& mark) const {
    return SourceLocation{source_name_, mark.line + 1, mark.column + 1};
  }

  [[noreturn]] void fail_at(const YAML::Mark& mark, const std::string& message) const {
    common::fail("{}:{}:{}: {}", source_name_, mark.line + 1, mark.column + 1, message);
  }

  // yaml-cpp 0.7 ends a quoted scalar that is never closed at the end of the text, without an
  // error, when a line break follows the opening quote: `partition: "unclosed` would swallow the
  // rest of the file into one value. So a quoted scalar's closing quote is looked for here, by
  // the YAML rules: \ escapes in "...", '' in '...'. `mark` is where the node starts, before
  // its anchor and tag, if any.
  void check_quote_closed(const YAML::Mark& mark) const {
    if (mark.pos < 0) return;
    std::size_t i = static_cast<std::size_t>(mark.pos) + position_offset_;
    auto skip_separation = [this, &i] {
      while (i < text_.size()) {
        if (text_[i] == ' ' || text_[i] == '\t' || text_[i] == '\n' || text_[i] == '\r') {
          ++i;
        } else if (text_[i] == '#') {
          while (i < text_.size() && text_[i] != '\n') ++i;
        } else {
          break;
        }
      }
    };
    while (i < text_.size() && (text_[i] == '&' || text_[i] == '!')) {  // &anchor, !tag
      while (i < text_.size() && text_[i] != ' ' && text_[i] != '\t' && text_[i] != '\n' &&
             text_[i] != '\r') {
        ++i;
      }
      skip_separation();
    }
    if (i >= text_.size() || (text_[i] != '"' && text_[i] != '\'')) return;  // block scalar
    const char quote = text_[i];
    for (++i; i < text_.size(); ++i) {
      if (quote == '"' && text_[i] == '\\') {
        ++i;
      } else if (text_[i] == quote) {
        if (quote == '\'' && i + 1 < text_.size() && text_[i + 1] == '\'') {
          ++i;
        } else {
          return;
        }
      }
    }
    fail_at(mark, fmt::format("the quoted string that starts here is not closed (add the closing "
                              "{}; without it YAML reads the rest of the file into this value)",
                              quote));
  }

  bool expecting_key() const {
    return !stack_.empty() && stack_.back().node.is_map() && !stack_.back().pending_key;
  }

  void check_collection_start(const YAML::Mark& mark, const std::string& tag,
                              std::string_view kind) {
    if (expecting_key()) {
      fail_at(mark, "complex mapping keys (a list or mapping used as a key) are not supported");
    }
    if (tag != "?" && tag != "!" && tag != std::string(kYamlTagPrefix) + std::string(kind)) {
      fail_at(mark, fmt::format("unsupported tag '{}'", tag));
    }
  }

  void accept_key(const std::string& key, bool plain, const YAML::Mark& mark) {
    Frame& frame = stack_.back();
    const bool is_merge = plain && key == "<<";
    const auto [existing, inserted] = frame.key_lines.emplace(key, mark.line + 1);
    if (!inserted) {
      fail_at(mark, fmt::format("duplicate key '{}' in this mapping (first defined at line {})",
                                key, existing->second));
    }
    frame.pending_key = key;
    frame.pending_key_location = locate(mark);
    frame.pending_key_is_merge = is_merge;
  }

  // A scalar as UTF-8. The document was checked to be UTF-8, but yaml-cpp 0.7 decodes the
  // double-quoted escapes \_ (U+00A0) and \N (U+0085) to the single Latin-1 bytes 0xA0 and
  // 0x85, which are not UTF-8: they are written back as the characters YAML means, so that
  // to_yaml never writes what parse_yaml refuses (found by the compose fuzzer).
  std::string utf8_scalar(const std::string& decoded, const YAML::Mark& mark) const {
    if (!common::first_invalid_utf8(decoded)) return decoded;
    std::string repaired;
    for (size_t i = 0; i < decoded.size();) {
      const int length = common::utf8_sequence_length(decoded, i);
      const auto byte = static_cast<unsigned char>(decoded[i]);
      if (length < 0 && (byte == 0xA0 || byte == 0x85)) {
        repaired += '\xC2';
        repaired += decoded[i++];
        continue;
      }
      if (length < 0) {
        fail_at(mark, fmt::format("a string decodes to invalid UTF-8 (byte 0x{:02x})", byte));
      }
      repaired.append(decoded, i, static_cast<size_t>(length));
      i += static_cast<size_t>(length);
    }
    return repaired;
  }

  Node make_scalar(const std::string& tag, const std::string& value, const SourceLocation& location,
                   const YAML::Mark& mark) const {
    if (tag == "?") return type_plain_scalar(value, location);
    if (tag == "!") return Node::string(value, location, true);
    if (!tag.starts_with(kYamlTagPrefix)) {
      fail_at(mark, fmt::format("unsupported tag '{}' (only the standard !!str, !!int, !!float, "
                                "!!bool and !!null tags are understood)",
                                tag));
    }
    const std::string_view type = std::string_view(tag).substr(kYamlTagPrefix.size());
    if (type == "str") return Node::string(value, location, true);
    if (type == "null") return Node::null(location);
    Node typed = type_plain_scalar(value, location);
    if (type == "int" && typed.is_int()) return typed;
    if (type == "float" && typed.is_float()) return typed;
    if (type == "float" && typed.is_int())
      return Node::floating(construct_float(value, location), location);
    if (type == "bool" && typed.is_bool()) return typed;
    fail_at(mark, fmt::format("'{}' is not a valid !!{}", value, type));
  }

  // A finished node goes into its parent (or becomes the document).
  void complete(Node node, YAML::anchor_t anchor, const YAML::Mark& mark) {
    if (anchor != 0) {
      anchors_[anchor] = node;
      anchor_sizes_[anchor] = tree_size(node);
    }
    if (stack_.empty()) {
      result_ = std::move(node);
      return;
    }
    Frame& parent = stack_.back();
    if (parent.node.is_list()) {
      parent.node.push_back(std::move(node));
      return;
    }
    if (!parent.pending_key) {
      fail_at(mark, "a list or mapping cannot be used as a mapping key");
    }
    if (parent.pending_key_is_merge) {
      add_merge_source(parent, node, mark);
    } else {
      parent.node.entries().push_back(MapEntry{std::move(*parent.pending_key), std::move(node)});
    }
    parent.pending_key.reset();
  }

  void add_merge_source(Frame& frame, const Node& source, const YAML::Mark& mark) {
    std::vector<const Node*> sources;
    if (source.is_map()) {
      sources.push_back(&source);
    } else if (source.is_list()) {
      // PyYAML merges a list of mappings with the first one winning: apply them last to first.
      for (auto item = source.items().rbegin(); item != source.items().rend(); ++item) {
        if (!item->is_map()) fail_at(mark, "a '<<' merge list may only contain mappings");
        sources.push_back(&*item);
      }
    } else {
      fail_at(mark, "a '<<' merge key needs a mapping or a list of mappings");
    }
    for (const Node* map : sources) {
      for (const auto& entry : map->entries()) frame.merged.push_back(entry);
    }
  }

  void finish_collection() {
    Frame frame = std::move(stack_.back());
    stack_.pop_back();
    complete(std::move(frame.node), frame.anchor, frame.mark);
  }

  std::string source_name_;
  std::string_view text_;         // the document, to check quoted scalars against
  std::size_t position_offset_;   // bytes before yaml-cpp's position 0
  std::vector<Frame> stack_;
  std::map<YAML::anchor_t, Node> anchors_;
  std::map<YAML::anchor_t, std::size_t> anchor_sizes_;  // tree_size of each anchored node
  std::size_t alias_expansion_ = 0;                     // nodes copied by aliases so far
  Node result_;
  int documents_ = 0;
};

// ---- writing

bool needs_double_quotes(std::string_view text) {
  for (const char byte : text) {
    const auto character = static_cast<unsigned char>(byte);
    if (character < 0x20 || character == 0x7f) return true;
  }
  return false;
}

// Whether `text` written plain would read back as the same string.
bool safe_as_plain(std::string_view text, bool is_key) {
  if (text.empty()) return false;
  // Retyped by a resolver, or refused by it (a float such as "._" that PyYAML matches and then
  // cannot construct, an integer beyond 64 bits): not plain. Matching only, so that writing
  // never fails.
  if (matches_null(text) || match_bool(text) || matches_int(text) || matches_float(text)) {
    return false;
  }
  // A byte-order mark at the start of a document makes readers switch encodings (yaml-cpp reads
  // "\xff\xfe..." as UTF-16); quoted, the document starts with a quote instead.
  if (text.starts_with("\xEF\xBB\xBF") || text.starts_with("\xFE\xFF") ||
      text.starts_with("\xFF\xFE")) {
    return false;
  }
  if (needs_double_quotes(text)) return false;
  if (std::string_view("-?:,[]{}#&*!|>'\"%@`").find(text.front()) != std::string_view::npos) {
    return false;
  }
  if (text.front() == ' ' || text.back() == ' ' || text.back() == ':') return false;
  if (text.find(": ") != std::string_view::npos || text.find(" #") != std::string_view::npos) {
    return false;
  }
  if (text.starts_with("---") || text.starts_with("...")) return false;
  if (is_key && text == "<<") return false;
  return true;
}

std::string quote_string(std::string_view text) {
  if (!needs_double_quotes(text)) {
    std::string quoted = "'";
    for (char character : text) {
      quoted += character;
      if (character == '\'') quoted += '\'';
    }
    return quoted + "'";
  }
  std::string quoted = "\"";
  for (const char byte : text) {
    const auto character = static_cast<unsigned char>(byte);
    switch (character) {
      case '"':
        quoted += "\\\"";
        break;
      case '\\':
        quoted += "\\\\";
        break;
      case '\n':
        quoted += "\\n";
        break;
      case '\t':
        quoted += "\\t";
        break;
      case '\r':
        quoted += "\\r";
        break;
      default:
        if (character < 0x20 || character == 0x7f) {
          quoted += fmt::format("\\x{:02x}", character);
        } else {
          quoted += static_cast<char>(character);
        }
    }
  }
  return quoted + "\"";
}

std::string string_text(std::string_view text, bool is_key) {
  return safe_as_plain(text, is_key) ? std::string(text) : quote_string(text);
}

// PyYAML's represent_float: lowercase repr, ".inf"/".nan", and a ".0" before a bare exponent
// so that YAML 1.1 readers see a float.
std::string float_text(double value) {
  if (std::isnan(value)) return ".nan";
  if (std::isinf(value)) return value > 0 ? ".inf" : "-.inf";
  std::string text = format_float(value);
  if (text.find('.') == std::string::npos) {
    const auto exponent = text.find('e');
    if (exponent != std::string::npos) text.insert(exponent, ".0");
  }
  return text;
}

std::string scalar_text(const Node& node) {
  switch (node.kind()) {
    case NodeKind::Null:
      return "null";
    case NodeKind::Bool:
      return node.as_bool() ? "true" : "false";
    case NodeKind::Int:
      return std::to_string(node.as_int());
    case NodeKind::Float:
      return float_text(node.as_double());
    case NodeKind::String:
      return string_text(node.as_string(), false);
    case NodeKind::List:
      return node.size() == 0 ? "[]" : "";
    case NodeKind::Map:
      return node.size() == 0 ? "{}" : "";
  }
  return "";
}

bool written_inline(const Node& node) {
  return !node.is_container() || node.size() == 0;
}

void emit(const Node& node, std::size_t indent, std::string& out);

// A block collection that starts on the current line after "- ": emit it at indent + 2 and
// replace the first line's indentation with the dash.
void emit_after_dash(const Node& node, std::size_t indent, std::string& out) {
  std::string nested;
  emit(node, indent + 2, nested);
  out += std::string(indent, ' ') + "- " + nested.substr(indent + 2);
}

// PyYAML's check_simple_key: a key of 128 characters or more is written as an explicit key
// ("? key" then ": value"); YAML readers limit implicit keys to 1024 characters.
constexpr std::size_t kLongestSimpleKey = 127;

void emit(const Node& node, std::size_t indent, std::string& out) {
  const std::string padding(indent, ' ');
  if (node.is_map()) {
    for (const auto& entry : node.entries()) {
      if (entry.key.size() > kLongestSimpleKey) {
        out += padding + "? " + string_text(entry.key, true) + "\n" + padding + ":";
        if (written_inline(entry.value)) {
          out += fmt::format(" {}\n", scalar_text(entry.value));
        } else {
          out += "\n";
          emit(entry.value, indent + 2, out);
        }
        continue;
      }
      out += padding + string_text(entry.key, true) + ":";
      if (written_inline(entry.value)) {
        out += fmt::format(" {}\n", scalar_text(entry.value));
      } else {
        out += "\n";
        // Like PyYAML, list items sit at the key's indentation; mappings nest by two.
        emit(entry.value, entry.value.is_list() ? indent : indent + 2, out);
      }
    }
  } else if (node.is_list()) {
    for (const auto& item : node.items()) {
      if (written_inline(item)) {
        out += padding + "- " + scalar_text(item) + "\n";
      } else {
        emit_after_dash(item, indent, out);
      }
    }
  }
}

// Whether lists and mappings nest more than `limit` deep (the node itself counts as one).
bool nests_deeper_than(const Node& node, std::size_t limit) {
  if (!node.is_container()) return false;
  if (limit == 0) return true;
  for (const auto& item : node.items()) {
    if (nests_deeper_than(item, limit - 1)) return true;
  }
  for (const auto& entry : node.entries()) {
    if (nests_deeper_than(entry.value, limit - 1)) return true;
  }
  return false;
}

}  // namespace

Node type_plain_scalar(std::string_view text, SourceLocation location) {
  if (matches_null(text)) return Node::null(std::move(location));
  if (auto boolean = match_bool(text)) return Node::boolean(*boolean, std::move(location));
  // PyYAML tries its float pattern before the int one and OmegaConf's float pattern last;
  // the patterns do not overlap, so the order here does not change the result.
  // The value first: construct_* names `location` in its errors, so it must not be moved yet.
  if (matches_int(text)) {
    const std::int64_t value = construct_int(text, location);
    return Node::integer(value, std::move(location));
  }
  if (matches_float(text)) {
    const double value = construct_float(text, location);
    return Node::floating(value, std::move(location));
  }
  return Node::string(std::string(text), std::move(location));
}

Node parse_yaml(std::string_view text, std::string_view source_name) {
  check_text_is_yaml(text, source_name);
  std::istringstream stream{std::string(text)};
  TreeBuilder builder{std::string(source_name), text};
  try {
    YAML::Parser parser(stream);
    while (parser.HandleNextDocument(builder)) {
    }
  } catch (const YAML::Exception& error) {
    common::fail("{}:{}:{}: {}", source_name, error.mark.line + 1, error.mark.column + 1,
                 error.msg);
  }
  return builder.take_result();
}

Node load_yaml_file(const std::filesystem::path& file) {
  std::error_code error;
  if (std::filesystem::is_directory(file, error))
    common::fail("{}: is a directory, not a YAML file", file.string());
  if (!std::filesystem::exists(file, error)) common::fail("{}: no such file", file.string());
  return parse_yaml(common::read_small_file(file, "the YAML file"), file.string());
}

std::string to_yaml(const Node& node) {
  if (nests_deeper_than(node, kMaxYamlNesting)) {
    common::fail(
        "cannot write the config as YAML: it nests more than {} lists and mappings, "
        "which YAML readers refuse",
        kMaxYamlNesting);
  }
  if (written_inline(node)) return scalar_text(node) + "\n";
  std::string out;
  emit(node, 0, out);
  return out;
}

}  // namespace launcher
