// The config value tree, dotted paths and Python-style value formatting; see node.hpp.
#include "launcher/config/node.hpp"

#include <charconv>
#include <cmath>
#include <cstdio>

#include "backend/common/error.hpp"
#include "backend/common/suggest.hpp"

namespace launcher {

std::string SourceLocation::describe() const {
  if (file.empty()) return "the command line";
  if (line <= 0) return file;
  return fmt::format("{}:{}:{}", file, line, column);
}

std::string_view kind_name(NodeKind kind) {
  switch (kind) {
    case NodeKind::Null:
      return "null";
    case NodeKind::Bool:
      return "bool";
    case NodeKind::Int:
      return "int";
    case NodeKind::Float:
      return "float";
    case NodeKind::String:
      return "string";
    case NodeKind::List:
      return "list";
    case NodeKind::Map:
      return "map";
  }
  return "unknown";
}

Node Node::null(SourceLocation location) {
  Node node;
  node.location_ = std::move(location);
  return node;
}

Node Node::boolean(bool value, SourceLocation location) {
  Node node;
  node.kind_ = NodeKind::Bool;
  node.bool_ = value;
  node.location_ = std::move(location);
  return node;
}

Node Node::integer(std::int64_t value, SourceLocation location) {
  Node node;
  node.kind_ = NodeKind::Int;
  node.int_ = value;
  node.location_ = std::move(location);
  return node;
}

Node Node::floating(double value, SourceLocation location) {
  Node node;
  node.kind_ = NodeKind::Float;
  node.float_ = value;
  node.location_ = std::move(location);
  return node;
}

Node Node::string(std::string value, SourceLocation location, bool quoted) {
  Node node;
  node.kind_ = NodeKind::String;
  node.string_ = std::move(value);
  node.quoted_ = quoted;
  node.location_ = std::move(location);
  return node;
}

Node Node::list(SourceLocation location) {
  Node node;
  node.kind_ = NodeKind::List;
  node.location_ = std::move(location);
  return node;
}

Node Node::map(SourceLocation location) {
  Node node;
  node.kind_ = NodeKind::Map;
  node.location_ = std::move(location);
  return node;
}

bool Node::is_missing() const {
  return is_string() && string_ == "???";
}

bool Node::has_interpolation() const {
  return is_string() && string_.find("${") != std::string::npos;
}

void Node::expect_kind(NodeKind expected, std::string_view path) const {
  if (kind_ == expected) return;
  const std::string where = path.empty() ? fmt::format("value at {}", location_.describe())
                                         : fmt::format("'{}' ({})", path, location_.describe());
  common::fail("{} has type {}, expected type {}", where, kind_name(kind_), kind_name(expected));
}

bool Node::as_bool(std::string_view path) const {
  expect_kind(NodeKind::Bool, path);
  return bool_;
}

std::int64_t Node::as_int(std::string_view path) const {
  expect_kind(NodeKind::Int, path);
  return int_;
}

double Node::as_double(std::string_view path) const {
  if (kind_ == NodeKind::Int) return static_cast<double>(int_);
  expect_kind(NodeKind::Float, path);
  return float_;
}

const std::string& Node::as_string(std::string_view path) const {
  expect_kind(NodeKind::String, path);
  return string_;
}

const Node* Node::child(std::string_view key) const {
  if (!is_map()) return nullptr;
  for (const auto& entry : entries_) {
    if (entry.key == key) return &entry.value;
  }
  return nullptr;
}

Node* Node::child(std::string_view key) {
  return const_cast<Node*>(static_cast<const Node&>(*this).child(key));
}

bool Node::contains(std::string_view key) const {
  return child(key) != nullptr;
}

const Node& Node::at(std::string_view key) const {
  expect_kind(NodeKind::Map, "");
  if (const Node* value = child(key)) return *value;
  const auto valid = keys();
  const std::string listed = common::list_if_short(valid);
  common::fail("key '{}' does not exist in the map at {}.{}{}", key, location_.describe(),
               common::did_you_mean(key, valid),
               listed.empty() ? fmt::format(" It has {} keys.", valid.size())
                              : fmt::format(" Valid keys: {}.", listed));
}

Node& Node::at(std::string_view key) {
  return const_cast<Node&>(static_cast<const Node&>(*this).at(key));
}

void Node::set(std::string key, Node value) {
  expect_kind(NodeKind::Map, "");
  if (Node* existing = child(key)) {
    *existing = std::move(value);
    return;
  }
  entries_.push_back(MapEntry{std::move(key), std::move(value)});
}

bool Node::erase(std::string_view key) {
  if (!is_map()) return false;
  for (auto entry = entries_.begin(); entry != entries_.end(); ++entry) {
    if (entry->key == key) {
      entries_.erase(entry);
      return true;
    }
  }
  return false;
}

std::vector<std::string> Node::keys() const {
  std::vector<std::string> result;
  result.reserve(entries_.size());
  for (const auto& entry : entries_) result.push_back(entry.key);
  return result;
}

const std::vector<MapEntry>& Node::entries() const {
  return entries_;
}
std::vector<MapEntry>& Node::entries() {
  return entries_;
}

const Node& Node::at(std::size_t index) const {
  expect_kind(NodeKind::List, "");
  if (index >= items_.size()) {
    common::fail("list index {} is out of range: the list at {} has {} items", index,
                 location_.describe(), items_.size());
  }
  return items_[index];
}

Node& Node::at(std::size_t index) {
  return const_cast<Node&>(static_cast<const Node&>(*this).at(index));
}

void Node::push_back(Node value) {
  expect_kind(NodeKind::List, "");
  items_.push_back(std::move(value));
}

const std::vector<Node>& Node::items() const {
  return items_;
}
std::vector<Node>& Node::items() {
  return items_;
}

std::size_t Node::size() const {
  if (is_map()) return entries_.size();
  if (is_list()) return items_.size();
  return 0;
}

bool operator==(const Node& left, const Node& right) {
  if (left.kind_ != right.kind_) return false;
  switch (left.kind_) {
    case NodeKind::Null:
      return true;
    case NodeKind::Bool:
      return left.bool_ == right.bool_;
    case NodeKind::Int:
      return left.int_ == right.int_;
    case NodeKind::Float:
      return left.float_ == right.float_ || (std::isnan(left.float_) && std::isnan(right.float_));
    case NodeKind::String:
      return left.string_ == right.string_;
    case NodeKind::List:
      return left.items_ == right.items_;
    case NodeKind::Map:
      if (left.entries_.size() != right.entries_.size()) return false;
      for (std::size_t i = 0; i < left.entries_.size(); ++i) {
        if (left.entries_[i].key != right.entries_[i].key ||
            !(left.entries_[i].value == right.entries_[i].value)) {
          return false;
        }
      }
      return true;
  }
  return false;
}

// ---- dotted paths

std::vector<std::string> split_path(std::string_view path) {
  std::vector<std::string> segments;
  if (path.empty()) return segments;
  std::string current;
  bool after_bracket = false;  // "a[0].b": the '.' after ']' starts no empty segment
  for (std::size_t i = 0; i < path.size(); ++i) {
    const char character = path[i];
    if (character == '.') {
      if (!after_bracket) segments.push_back(std::move(current));
      current.clear();
      after_bracket = false;
    } else if (character == '[') {
      if (!after_bracket) segments.push_back(std::move(current));
      current.clear();
      const auto close = path.find(']', i);
      if (close == std::string_view::npos) {
        current = std::string(path.substr(i));
        break;
      }
      segments.emplace_back(path.substr(i + 1, close - i - 1));
      i = close;
      after_bracket = true;
    } else {
      current += character;
      after_bracket = false;
    }
  }
  if (!after_bracket) segments.push_back(std::move(current));
  return segments;
}

std::string join_path(const std::vector<std::string>& segments, std::size_t count) {
  std::string path;
  for (std::size_t i = 0; i < count && i < segments.size(); ++i) {
    if (i > 0) path += '.';
    path += segments[i];
  }
  return path;
}

std::string join_path(std::string_view parent, std::string_view key) {
  if (parent.empty()) return std::string(key);
  return fmt::format("{}.{}", parent, key);
}

const Node* child_at(const Node& node, std::string_view segment) {
  if (node.is_map()) return node.child(segment);
  if (!node.is_list() || segment.empty()) return nullptr;
  std::size_t index = 0;
  const auto [end, error] = std::from_chars(segment.data(), segment.data() + segment.size(), index);
  if (error != std::errc() || end != segment.data() + segment.size() || index >= node.size()) {
    return nullptr;
  }
  return &node.items()[index];
}

Node* child_at(Node& node, std::string_view segment) {
  return const_cast<Node*>(child_at(static_cast<const Node&>(node), segment));
}

const Node* find(const Node& root, std::string_view path) {
  const Node* current = &root;
  for (const auto& segment : split_path(path)) {
    current = child_at(*current, segment);
    if (current == nullptr) return nullptr;
  }
  return current;
}

Node* find(Node& root, std::string_view path) {
  return const_cast<Node*>(find(static_cast<const Node&>(root), path));
}

std::string describe_missing_key(const Node& parent, std::string_view parent_path,
                                 std::string_view key) {
  const std::string where =
      parent_path.empty() ? "the config root" : fmt::format("'{}'", parent_path);
  if (parent.is_list()) {
    return fmt::format("'{}' is not a valid index into the list {} ({} items).", key, where,
                       parent.size());
  }
  if (!parent.is_map()) {
    return fmt::format("{} has type {}, so it has no key '{}'.", where, kind_name(parent.kind()),
                       key);
  }
  const auto keys = parent.keys();
  std::string message = fmt::format("key '{}' does not exist in {}.", key, where);
  message += common::did_you_mean(key, keys);
  const std::string valid = common::list_if_short(keys);
  if (!valid.empty()) message += fmt::format(" Valid keys: {}.", valid);
  if (keys.empty()) message += " It has no keys.";
  return message;
}

const Node& at_path(const Node& root, std::string_view path) {
  const auto segments = split_path(path);
  const Node* current = &root;
  for (std::size_t i = 0; i < segments.size(); ++i) {
    const Node* next = child_at(*current, segments[i]);
    if (next == nullptr) {
      common::fail("'{}' not found: {}", path,
                   describe_missing_key(*current, join_path(segments, i), segments[i]));
    }
    current = next;
  }
  return *current;
}

std::size_t tree_size(const Node& node) {
  std::size_t size = 1;
  for (const auto& item : node.items()) size += tree_size(item);
  for (const auto& entry : node.entries()) size += tree_size(entry.value);
  return size;
}

// ---- formatting

std::string format_float(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  // Shortest round-trip digits, laid out as Python's float.__repr__ does: positional for
  // decimal exponents in [-4, 16), scientific with a two-digit exponent otherwise.
  char buffer[64];
  const auto result =
      std::to_chars(buffer, buffer + sizeof(buffer), value, std::chars_format::scientific);
  std::string scientific(buffer, result.ptr);
  const auto e = scientific.find('e');
  std::string mantissa = scientific.substr(0, e);
  const int exponent = std::stoi(scientific.substr(e + 1));
  const bool negative = mantissa[0] == '-';
  if (negative) mantissa.erase(0, 1);
  std::string digits;
  for (char character : mantissa) {
    if (character != '.') digits += character;
  }
  std::string text;
  if (exponent >= -4 && exponent < 16) {
    const int point = exponent + 1;  // digits before the decimal point
    if (point <= 0) {
      text = fmt::format("0.{}{}", std::string(static_cast<std::size_t>(-point), '0'), digits);
    } else if (static_cast<std::size_t>(point) >= digits.size()) {
      text = digits + std::string(static_cast<std::size_t>(point) - digits.size(), '0') + ".0";
    } else {
      text = digits.substr(0, static_cast<std::size_t>(point)) + "." +
             digits.substr(static_cast<std::size_t>(point));
    }
  } else {
    text = digits.substr(0, 1);
    if (digits.size() > 1) text += fmt::format(".{}", digits.substr(1));
    text += fmt::format("e{}{:02d}", exponent < 0 ? '-' : '+', std::abs(exponent));
  }
  return negative ? fmt::format("-{}", text) : text;
}

namespace {

std::string python_repr_string(const std::string& text) {
  // Python prefers single quotes and switches to double quotes only to avoid escaping.
  const bool has_single = text.find('\'') != std::string::npos;
  const bool has_double = text.find('"') != std::string::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string result(1, quote);
  for (const char byte : text) {
    const auto character = static_cast<unsigned char>(byte);
    switch (character) {
      case '\\':
        result += "\\\\";
        break;
      case '\n':
        result += "\\n";
        break;
      case '\r':
        result += "\\r";
        break;
      case '\t':
        result += "\\t";
        break;
      default:
        if (character == static_cast<unsigned char>(quote)) {
          result += '\\';
          result += static_cast<char>(character);
        } else if (character < 0x20 || character == 0x7f) {
          result += fmt::format("\\x{:02x}", character);
        } else {
          result += static_cast<char>(character);
        }
    }
  }
  return result + quote;
}

std::string python_repr(const Node& node) {
  return node.is_string() ? python_repr_string(node.as_string()) : python_str(node);
}

}  // namespace

std::string python_str(const Node& node) {
  switch (node.kind()) {
    case NodeKind::Null:
      return "None";
    case NodeKind::Bool:
      return node.as_bool() ? "True" : "False";
    case NodeKind::Int:
      return std::to_string(node.as_int());
    case NodeKind::Float:
      return format_float(node.as_double());
    case NodeKind::String:
      return node.as_string();
    case NodeKind::List: {
      std::string text = "[";
      for (std::size_t i = 0; i < node.size(); ++i) {
        if (i > 0) text += ", ";
        text += python_repr(node.items()[i]);
      }
      return text + "]";
    }
    case NodeKind::Map: {
      std::string text = "{";
      for (std::size_t i = 0; i < node.size(); ++i) {
        if (i > 0) text += ", ";
        text +=
            python_repr_string(node.entries()[i].key) + ": " + python_repr(node.entries()[i].value);
      }
      return text + "}";
    }
  }
  return "";
}

}  // namespace launcher
