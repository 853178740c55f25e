// A recursive-descent parser for the Hydra override / OmegaConf interpolation value grammar;
// see value_grammar.hpp. Token rules mirror the ANTLR lexers (INT, FLOAT, BOOL, NULL, ID,
// UNQUOTED_CHAR, ESC, WS, quoted modes); the parser works on characters and types a
// primitive only when it is a single token, as the grammars' visitors do.
#include "launcher/config/value_grammar.hpp"

#include <charconv>
#include <cmath>
#include <limits>

#include "backend/common/error.hpp"

namespace launcher::grammar {

namespace {

enum class Dialect { HydraOverride, OmegaConfArguments };

bool is_ascii_letter(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}
bool is_digit(char c) {
  return c >= '0' && c <= '9';
}
bool is_space(char c) {
  return c == ' ' || c == '\t';
}

// Characters of an unquoted primitive besides escapes, whitespace and "${": ID characters and
// UNQUOTED_CHAR [/\-\\+.$%*@?|] and COLON. Bytes of UTF-8 sequences are accepted too (the
// grammars only allow ASCII letters; being lenient here costs nothing).
bool is_unquoted_character(char c, bool colon_allowed) {
  if (is_ascii_letter(c) || is_digit(c) || c == '_') return true;
  if (static_cast<unsigned char>(c) >= 0x80) return true;
  if (c == ':') return colon_allowed;
  return std::string_view("/-\\+.$%*@?|").find(c) != std::string_view::npos;
}

// The characters ESC un-escapes: \\ \( \) \[ \] \{ \} \: \= \, \<space> \<tab>.
bool is_escapable(char c) {
  return std::string_view("\\()[]{}:=, \t").find(c) != std::string_view::npos;
}

// INTER_KEY: ~[\\{}()[\]:. \t'"]
bool is_interpolation_key_character(char c) {
  return std::string_view("\\{}()[]:. \t'\"").find(c) == std::string_view::npos;
}

bool is_identifier(std::string_view text) {
  if (text.empty() || !(is_ascii_letter(text[0]) || text[0] == '_')) return false;
  for (char c : text) {
    if (!(is_ascii_letter(c) || is_digit(c) || c == '_' || c == '-')) return false;
  }
  return true;
}

// ---- single-token typing (INT, FLOAT, BOOL, NULL of the lexers)

bool equals_ignoring_case(std::string_view text, std::string_view word) {
  if (text.size() != word.size()) return false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    if (c != word[i]) return false;
  }
  return true;
}

// INT_UNSIGNED: '0' | [1-9] (('_')? DIGIT)*  — returns the length matched at `text` start.
std::size_t match_unsigned_int(std::string_view text) {
  if (text.empty() || !is_digit(text[0])) return 0;
  if (text[0] == '0') return 1;
  std::size_t i = 1;
  while (i < text.size()) {
    if (is_digit(text[i])) {
      ++i;
    } else if (text[i] == '_' && i + 1 < text.size() && is_digit(text[i + 1])) {
      i += 2;
    } else {
      break;
    }
  }
  return i;
}

// DIGIT (('_')? DIGIT)*
std::size_t match_digits(std::string_view text) {
  if (text.empty() || !is_digit(text[0])) return 0;
  std::size_t i = 1;
  while (i < text.size()) {
    if (is_digit(text[i])) {
      ++i;
    } else if (text[i] == '_' && i + 1 < text.size() && is_digit(text[i + 1])) {
      i += 2;
    } else {
      break;
    }
  }
  return i;
}

std::string_view without_sign(std::string_view text) {
  if (!text.empty() && (text[0] == '+' || text[0] == '-')) text.remove_prefix(1);
  return text;
}

bool matches_int_token(std::string_view text) {
  const std::string_view body = without_sign(text);
  return !body.empty() && match_unsigned_int(body) == body.size();
}

// POINT_FLOAT: INT_UNSIGNED '.' | INT_UNSIGNED? '.' DIGIT (('_')? DIGIT)*
std::size_t match_point_float(std::string_view text) {
  const std::size_t integer = match_unsigned_int(text);
  if (integer >= text.size() || text[integer] != '.') return 0;
  const std::size_t fraction = match_digits(text.substr(integer + 1));
  if (fraction == 0 && integer == 0) return 0;
  return integer + 1 + fraction;
}

bool matches_float_token(std::string_view text) {
  const std::string_view body = without_sign(text);
  if (equals_ignoring_case(body, "inf") || equals_ignoring_case(body, "nan")) return true;
  std::size_t mantissa = match_point_float(body);
  if (mantissa == body.size() && mantissa > 0) return true;
  // EXPONENT_FLOAT: (INT_UNSIGNED | POINT_FLOAT) [eE] [+-]? DIGIT (('_')? DIGIT)*
  if (mantissa == 0) mantissa = match_unsigned_int(body);
  if (mantissa == 0 || mantissa >= body.size() ||
      (body[mantissa] != 'e' && body[mantissa] != 'E')) {
    return false;
  }
  std::string_view exponent = body.substr(mantissa + 1);
  if (!exponent.empty() && (exponent[0] == '+' || exponent[0] == '-')) exponent.remove_prefix(1);
  return !exponent.empty() && match_digits(exponent) == exponent.size();
}

std::string without_underscores(std::string_view text) {
  std::string result;
  for (char c : text) {
    if (c != '_') result += c;
  }
  return result;
}

std::string python_float_text(std::string_view text) {
  std::string value = without_underscores(text);
  for (char& c : value) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return value;
}

// ---- the parser

// One lexer token of an unquoted primitive, coarsened: runs of ordinary characters are one
// Raw token, which is typed only if it is the primitive's only token and matches one
// complete INT/FLOAT/BOOL/NULL token.
struct PrimitiveToken {
  enum class Kind { Raw, Space, Escaped, Interpolation };
  Kind kind = Kind::Raw;
  std::string text;
  std::shared_ptr<const Interpolation> interpolation;
};

class Parser {
 public:
  Parser(std::string_view text, std::string_view description, Dialect dialect)
      : text_(text), description_(description), dialect_(dialect) {}

  void set_position(std::size_t position) { position_ = position; }

  Text parse_config_string() {
    Text text;
    while (!at_end()) {
      if (at_interpolation_start()) {
        text.push_back(TextPiece{"", parse_interpolation()});
      } else if (peek() == '\\') {
        const std::size_t run = backslash_run();
        if (text_.substr(position_ + run, 2) == "${") {
          // An odd run escapes the interpolation; an even run is halved and precedes one.
          append_literal(text, std::string(run / 2, '\\'));
          position_ += run;
          if (run % 2 == 1) {
            append_literal(text, "${");
            position_ += 2;
          }
        } else {
          append_literal(text, std::string(run, '\\'));
          position_ += run;
        }
      } else {
        // Up to the next character that may start an interpolation or an escape.
        std::size_t end = text_.find_first_of("$\\", position_ + 1);
        if (end == std::string_view::npos) end = text_.size();
        append_literal(text, std::string(text_.substr(position_, end - position_)));
        position_ = end;
      }
    }
    return text;
  }

  Element parse_override_value() {
    Element element = parse_element();
    skip_whitespace();
    if (peek() == ',') {
      fail_at(position_,
              "a comma-separated value is a sweep: add -m (--multirun) to launch one job per "
              "value; quote the value or escape the commas (\\,) for a literal string, or write "
              "[a,b] for a list");
    }
    if (!at_end()) fail_unexpected();
    return element;
  }

  // OverrideParser.g4's `value: element | simpleChoiceSweep`, plus a function call as the
  // whole value: ID '(' (ID '=')? element (',' (ID '=')? element)* ')'.
  SweepValue parse_override_sweep() {
    SweepValue value;
    skip_whitespace();
    const std::size_t start = position_;
    const std::size_t name_end = identifier_end(start);
    if (name_end > start && name_end < text_.size() && text_[name_end] == '(') {
      value.kind = SweepValue::Kind::Function;
      value.function = std::string(text_.substr(start, name_end - start));
      value.function_position = start;
      position_ = name_end + 1;
      parse_function_arguments(value);
      skip_whitespace();
      if (!at_end()) fail_unexpected();
      return value;
    }
    value.items.push_back(parse_element());
    skip_whitespace();
    while (peek() == ',') {
      value.kind = SweepValue::Kind::SimpleSweep;
      ++position_;
      skip_whitespace();
      if (at_end() || peek() == ',') fail_at(position_, "expected a value after ','");
      value.items.push_back(parse_element());
      skip_whitespace();
    }
    if (!at_end()) fail_unexpected();
    return value;
  }

 private:
  // The parser recurses once per level of [ ], { } and ${ }; a bound keeps hostile input from
  // overflowing the stack (the ANTLR parsers stop at Python's recursion limit).
  static constexpr std::size_t kMaxNesting = 100;
  struct NestingGuard {
    Parser& parser;
    explicit NestingGuard(Parser& owner) : parser(owner) {
      if (++parser.nesting_ > kMaxNesting) {
        parser.fail_at(parser.position_, fmt::format("more than {} levels of nested [ ], {{ }} "
                                                     "or ${{ }}",
                                                     kMaxNesting));
      }
    }
    ~NestingGuard() { --parser.nesting_; }
    NestingGuard(const NestingGuard&) = delete;
    NestingGuard& operator=(const NestingGuard&) = delete;
  };

  bool at_end() const { return position_ >= text_.size(); }
  char peek(std::size_t ahead = 0) const {
    return position_ + ahead < text_.size() ? text_[position_ + ahead] : '\0';
  }
  bool at_interpolation_start() const { return peek() == '$' && peek(1) == '{'; }
  void skip_whitespace() {
    while (!at_end() && is_space(peek())) ++position_;
  }
  std::size_t backslash_run() const {
    std::size_t run = 0;
    while (peek(run) == '\\') ++run;
    return run;
  }

  // The end of the ID token ([a-zA-Z_][a-zA-Z0-9_]*) starting at `start`; `start` if none.
  std::size_t identifier_end(std::size_t start) const {
    std::size_t end = start;
    while (end < text_.size() && (is_ascii_letter(text_[end]) || text_[end] == '_' ||
                                  (end > start && is_digit(text_[end])))) {
      ++end;
    }
    return end;
  }

  // Arguments up to ')': positional elements or `name=element`.
  void parse_function_arguments(SweepValue& value) {
    skip_whitespace();
    if (peek() == ')') {
      ++position_;
      return;
    }
    while (true) {
      skip_whitespace();
      std::string name;
      const std::size_t name_end = identifier_end(position_);
      if (name_end > position_ && name_end < text_.size() && text_[name_end] == '=') {
        name = std::string(text_.substr(position_, name_end - position_));
        position_ = name_end + 1;
        skip_whitespace();
      }
      if (at_end()) fail_at(position_, "missing ')'");
      if (peek() == ',' || peek() == ')') fail_at(position_, "expected a value");
      value.items.push_back(parse_element());
      value.argument_names.push_back(std::move(name));
      skip_whitespace();
      if (peek() == ',') {
        ++position_;
        continue;
      }
      if (peek() == ')') {
        ++position_;
        return;
      }
      if (at_end()) fail_at(position_, "missing ')'");
      fail_unexpected();
    }
  }

  [[noreturn]] void fail_at(std::size_t position, std::string_view message) const {
    throw common::Error(caret_message(description_, text_, position, message));
  }

  [[noreturn]] void fail_unexpected() const {
    const char c = peek();
    if (at_end()) fail_at(position_, "unexpected end of text");
    if (c == '=') {
      fail_at(position_, "'=' in a value must be quoted ('a=b') or escaped (a\\=b)");
    }
    if (c == '(' || c == ')') {
      if (dialect_ == Dialect::HydraOverride) {
        fail_at(position_,
                "function calls are not supported here: choice(...) and range(...) are sweeps, "
                "allowed as a whole value with -m (--multirun); quote the value if the "
                "parentheses are literal text");
      }
      fail_at(position_, fmt::format("'{}' must be quoted or escaped (\\{})", c, c));
    }
    if (c == '\'' || c == '"') {
      fail_at(position_, "a quoted string must be a whole value (or a whole list item)");
    }
    if (std::string_view("[]{},:\\").find(c) != std::string_view::npos ||
        is_unquoted_character(c, true)) {
      fail_at(position_, fmt::format("unexpected '{}'", c));
    }
    fail_at(position_,
            fmt::format("character '{}' is not allowed in an unquoted value; quote the value", c));
  }

  static void append_literal(Text& text, const std::string& literal) {
    if (literal.empty()) return;
    if (!text.empty() && !text.back().interpolation) {
      text.back().literal += literal;
    } else {
      text.push_back(TextPiece{literal, nullptr});
    }
  }

  std::shared_ptr<Interpolation> parse_interpolation() {
    const NestingGuard guard(*this);
    const std::size_t start = position_;
    position_ += 2;  // "${"
    skip_whitespace();
    auto interpolation = std::make_shared<Interpolation>();
    while (peek() == '.') {
      ++interpolation->leading_dots;
      ++position_;
    }
    bool used_brackets = false;
    bool names_are_identifiers = true;
    while (true) {
      Text segment;
      if (peek() == '[') {
        ++position_;
        segment = parse_key_segment(start);
        if (peek() != ']') fail_at(position_, "expected ']' to close the key in brackets");
        ++position_;
        used_brackets = true;
      } else {
        segment = parse_key_segment(start);
      }
      if (!is_single_interpolation(segment) && !is_identifier(segment.front().literal)) {
        names_are_identifiers = false;
      }
      interpolation->key.push_back(std::move(segment));
      if (peek() == '.') {
        ++position_;
        continue;
      }
      if (peek() == '[') continue;
      break;
    }
    skip_whitespace();
    if (peek() == ':') {
      if (interpolation->leading_dots > 0 || used_brackets || !names_are_identifiers) {
        fail_at(position_, "a resolver name must be identifiers separated by dots, as in oc.env");
      }
      ++position_;
      interpolation->kind = Interpolation::Kind::Resolver;
      interpolation->resolver_name = std::move(interpolation->key);
      interpolation->key.clear();
      // Resolver arguments follow OmegaConf's grammar even inside a Hydra override.
      const Dialect saved = dialect_;
      dialect_ = Dialect::OmegaConfArguments;
      interpolation->arguments = parse_sequence('}');
      dialect_ = saved;
    } else if (peek() == '}') {
      ++position_;
    } else if (at_end()) {
      fail_at(start, "unterminated interpolation: missing '}'");
    } else {
      fail_at(position_, "expected '}' to close the interpolation (or ':' after a resolver name)");
    }
    interpolation->source = std::string(text_.substr(start, position_ - start));
    return interpolation;
  }

  // One key segment of a node interpolation: a nested interpolation or INTER_KEY characters.
  Text parse_key_segment(std::size_t interpolation_start) {
    Text segment;
    if (at_interpolation_start()) {
      segment.push_back(TextPiece{"", parse_interpolation()});
    } else {
      const std::size_t start = position_;
      while (!at_end() && is_interpolation_key_character(peek()) && !at_interpolation_start()) {
        ++position_;
      }
      if (position_ == start) {
        if (at_end()) fail_at(interpolation_start, "unterminated interpolation: missing '}'");
        if (peek() == '}') fail_at(position_, "expected a key name before '}'");
        fail_at(position_, fmt::format("expected a key name, found '{}'", peek()));
      }
      segment.push_back(TextPiece{std::string(text_.substr(start, position_ - start)), nullptr});
    }
    if (at_interpolation_start()) {
      fail_at(position_, "an interpolation can only be a whole key segment, as in ${a.${b}}");
    }
    return segment;
  }

  // Items separated by commas up to `close`; OmegaConf sequences allow empty items ("").
  std::vector<Element> parse_sequence(char close) {
    std::vector<Element> items;
    skip_whitespace();
    if (peek() == close) {
      ++position_;
      return items;
    }
    while (true) {
      skip_whitespace();
      if (peek() == ',' || peek() == close) {
        if (dialect_ == Dialect::HydraOverride) fail_at(position_, "expected a value");
        Element empty;
        empty.scalar = Node::string("");
        empty.position = position_;
        items.push_back(std::move(empty));
      } else {
        items.push_back(parse_element());
        skip_whitespace();
      }
      if (peek() == ',') {
        ++position_;
        continue;
      }
      if (peek() == close) {
        ++position_;
        return items;
      }
      if (at_end()) fail_at(position_, fmt::format("missing '{}'", close));
      fail_unexpected();
    }
  }

  Element parse_element() {
    skip_whitespace();
    const NestingGuard guard(*this);
    const std::size_t start = position_;
    Element element;
    if (peek() == '[') {
      ++position_;
      element.kind = Element::Kind::List;
      element.items = parse_sequence(']');
    } else if (peek() == '{') {
      element.kind = Element::Kind::Dict;
      parse_dict(element);
    } else if (peek() == '\'' || peek() == '"') {
      element.kind = Element::Kind::Quoted;
      element.text = parse_quoted();
    } else {
      const auto tokens = scan_primitive(false);
      if (tokens.empty()) {
        if (at_end()) fail_at(position_, "expected a value");
        fail_unexpected();
      }
      make_primitive(tokens, element);
    }
    element.position = start;
    element.source = std::string(text_.substr(start, position_ - start));
    return element;
  }

  void parse_dict(Element& element) {
    ++position_;  // "{"
    skip_whitespace();
    if (peek() == '}') {
      ++position_;
      return;
    }
    while (true) {
      skip_whitespace();
      const std::size_t key_start = position_;
      const auto tokens = scan_primitive(true);
      std::string key;
      for (const auto& token : tokens) key += token.text;
      if (tokens.empty()) fail_at(key_start, "expected a dictionary key");
      skip_whitespace();
      if (peek() != ':') {
        if (at_interpolation_start())
          fail_at(position_, "a dictionary key cannot be an interpolation");
        fail_at(position_, "expected ':' after the dictionary key");
      }
      ++position_;
      skip_whitespace();
      element.entries.push_back(DictEntry{std::move(key), parse_element()});
      skip_whitespace();
      if (peek() == ',') {
        ++position_;
        continue;
      }
      if (peek() == '}') {
        ++position_;
        return;
      }
      if (at_end()) fail_at(position_, "missing '}'");
      fail_unexpected();
    }
  }

  // The tokens of an unquoted primitive, without leading or trailing whitespace. Stops at
  // anything that is not part of a primitive; the caller decides whether that is an error.
  std::vector<PrimitiveToken> scan_primitive(bool dictionary_key) {
    std::vector<PrimitiveToken> tokens;
    auto add = [&tokens](PrimitiveToken::Kind kind, std::string text) {
      if (!tokens.empty() && tokens.back().kind == kind && kind != PrimitiveToken::Kind::Escaped &&
          kind != PrimitiveToken::Kind::Interpolation) {
        tokens.back().text += text;
      } else {
        tokens.push_back(PrimitiveToken{kind, std::move(text), nullptr});
      }
    };
    while (!at_end()) {
      const char c = peek();
      if (at_interpolation_start()) {
        if (dictionary_key) break;
        auto interpolation = parse_interpolation();
        tokens.push_back(PrimitiveToken{PrimitiveToken::Kind::Interpolation, interpolation->source,
                                        interpolation});
      } else if (c == '\\' && is_escapable(peek(1))) {
        add(PrimitiveToken::Kind::Escaped, std::string(1, peek(1)));
        position_ += 2;
      } else if (is_space(c)) {
        add(PrimitiveToken::Kind::Space, std::string(1, c));
        ++position_;
      } else if (is_unquoted_character(c, !dictionary_key)) {
        add(PrimitiveToken::Kind::Raw, std::string(1, c));
        ++position_;
      } else {
        break;
      }
    }
    // Leading and trailing whitespace belongs to the separators around the value.
    while (!tokens.empty() && tokens.back().kind == PrimitiveToken::Kind::Space) {
      position_ -= tokens.back().text.size();
      tokens.pop_back();
    }
    while (!tokens.empty() && tokens.front().kind == PrimitiveToken::Kind::Space) {
      tokens.erase(tokens.begin());
    }
    return tokens;
  }

  void make_primitive(const std::vector<PrimitiveToken>& tokens, Element& element) {
    if (tokens.size() == 1 && tokens[0].kind == PrimitiveToken::Kind::Raw) {
      element.kind = Element::Kind::Scalar;
      element.scalar = typed_token(tokens[0].text);
      return;
    }
    if (tokens.size() == 1 && tokens[0].kind == PrimitiveToken::Kind::Escaped) {
      element.kind = Element::Kind::Scalar;
      element.scalar = Node::string(tokens[0].text);
      return;
    }
    element.kind = Element::Kind::Unquoted;
    for (const auto& token : tokens) {
      if (token.kind == PrimitiveToken::Kind::Interpolation) {
        element.text.push_back(TextPiece{"", token.interpolation});
      } else {
        append_literal(element.text, token.text);
      }
    }
  }

  Node typed_token(const std::string& text) const {
    if (matches_float_token(text)) {
      const std::string value = python_float_text(text);
      const std::string_view body = without_sign(value);
      const double sign = value[0] == '-' ? -1.0 : 1.0;
      if (body == "inf") return Node::floating(sign * std::numeric_limits<double>::infinity());
      if (body == "nan") return Node::floating(std::numeric_limits<double>::quiet_NaN());
      double number = 0;
      const auto [end, error] = std::from_chars(body.data(), body.data() + body.size(), number);
      if (error != std::errc() || end != body.data() + body.size()) {
        fail_at(position_, fmt::format("'{}' is not a valid float", text));
      }
      return Node::floating(sign * number);
    }
    if (matches_int_token(text)) {
      // The magnitude is read unsigned: −2^63 (INT64_MIN) fits although 2^63 does not.
      const std::string value = without_underscores(without_sign(text));
      const bool negative = text[0] == '-';
      std::uint64_t magnitude = 0;
      const auto [end, error] =
          std::from_chars(value.data(), value.data() + value.size(), magnitude);
      constexpr std::uint64_t kLargest = std::numeric_limits<std::int64_t>::max();
      if (error != std::errc() || end != value.data() + value.size() ||
          magnitude > kLargest + (negative ? 1 : 0)) {
        fail_at(position_, fmt::format("integer '{}' does not fit in 64 bits (valid: {} to {})",
                                       text, std::numeric_limits<std::int64_t>::min(),
                                       std::numeric_limits<std::int64_t>::max()));
      }
      if (!negative) return Node::integer(static_cast<std::int64_t>(magnitude));
      // −magnitude without overflow: −(m − 1) − 1 is −2^63 for m = 2^63.
      return Node::integer(magnitude == 0 ? 0 : -static_cast<std::int64_t>(magnitude - 1) - 1);
    }
    if (equals_ignoring_case(text, "true")) return Node::boolean(true);
    if (equals_ignoring_case(text, "false")) return Node::boolean(false);
    if (equals_ignoring_case(text, "null")) return Node::null();
    return Node::string(text);
  }

  // '...' or "...": the quote is escaped by an odd run of backslashes before it (the run is
  // halved); an even run before the closing quote is halved too; other backslashes are
  // literal. Before "${" the same rule applies in OmegaConf, while a Hydra override keeps
  // those backslashes for OmegaConf to interpret when the value is resolved.
  Text parse_quoted() {
    const std::size_t start = position_;
    const char quote = peek();
    ++position_;
    Text text;
    while (true) {
      if (at_end()) fail_at(start, fmt::format("unterminated quoted string: missing {}", quote));
      const char c = peek();
      if (c == quote) {
        ++position_;
        return text;
      }
      if (at_interpolation_start()) {
        text.push_back(TextPiece{"", parse_interpolation()});
        continue;
      }
      if (c != '\\') {
        append_literal(text, std::string(1, c));
        ++position_;
        continue;
      }
      const std::size_t run = backslash_run();
      const std::size_t after = position_ + run;
      if (after < text_.size() && text_[after] == quote) {
        append_literal(text, std::string(run / 2, '\\'));
        position_ = after;
        if (run % 2 == 1) {
          append_literal(text, std::string(1, quote));
          ++position_;
        }
      } else if (text_.substr(after, 2) == "${") {
        if (dialect_ == Dialect::HydraOverride) {
          const std::string raw(run, '\\');
          append_literal(text, run % 2 == 1 ? raw + "${" : raw);
        } else {
          append_literal(text, std::string(run / 2, '\\') + (run % 2 == 1 ? "${" : ""));
        }
        position_ = after + (run % 2 == 1 ? 2 : 0);
      } else {
        append_literal(text, std::string(run, '\\'));
        position_ = after;
      }
    }
  }

  std::string_view text_;
  std::string_view description_;
  Dialect dialect_;
  std::size_t position_ = 0;
  std::size_t nesting_ = 0;  // current depth of parse_element / parse_interpolation
};

}  // namespace

bool is_single_interpolation(const Text& text) {
  return text.size() == 1 && text[0].interpolation != nullptr;
}

Text parse_config_string(std::string_view text, std::string_view description) {
  Parser parser(text, description, Dialect::OmegaConfArguments);
  return parser.parse_config_string();
}

Element parse_override_value(std::string_view text, std::size_t offset,
                             std::string_view description) {
  Parser parser(text, description, Dialect::HydraOverride);
  parser.set_position(offset);
  return parser.parse_override_value();
}

SweepValue parse_override_sweep(std::string_view text, std::size_t offset,
                                std::string_view description) {
  Parser parser(text, description, Dialect::HydraOverride);
  parser.set_position(offset);
  return parser.parse_override_sweep();
}

std::string caret_message(std::string_view description, std::string_view text, std::size_t position,
                          std::string_view message) {
  // Tabs would shift the caret; show them as spaces in the echoed text.
  std::string shown(text);
  for (char& c : shown) {
    if (c == '\t' || c == '\n' || c == '\r') c = ' ';
  }
  return fmt::format("{}: {} at column {}\n  {}\n  {}^", description, message, position + 1, shown,
                     std::string(std::min(position, text.size()), ' '));
}

}  // namespace launcher::grammar
