// Hydra override parsing and application; see overrides.hpp.
#include "launcher/config/overrides.hpp"

#include <algorithm>

#include "backend/common/error.hpp"
#include "backend/common/utf8.hpp"
#include "launcher/config/merge.hpp"
#include "launcher/config/value_grammar.hpp"

namespace launcher {

namespace {

bool is_key_character(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '$' || c == '-';
}

// Checks one '.'- or '/'-separated part of a key (DOT_PATH segments: identifiers, which may
// contain '$' and '-', or list indices; group path segments: identifiers).
void check_key_segments(std::string_view text, std::size_t start, std::size_t end, char separator,
                        std::string_view description, std::string_view what) {
  // Each segment is a level of the config; YAML cannot hold much more (kMaxYamlNesting).
  constexpr std::size_t kMaxSegments = 100;
  if (static_cast<std::size_t>(std::count(text.begin() + start, text.begin() + end, separator)) >=
      kMaxSegments) {
    throw common::Error(
        grammar::caret_message(description, text, start,
                               fmt::format("the {} has more than {} parts", what, kMaxSegments)));
  }
  std::size_t segment_start = start;
  for (std::size_t i = start; i <= end; ++i) {
    if (i < end && text[i] != separator) {
      if (!is_key_character(text[i])) {
        throw common::Error(grammar::caret_message(
            description, text, i,
            fmt::format("unexpected character '{}' in the {}", text[i], what)));
      }
      continue;
    }
    if (i == segment_start) {
      throw common::Error(
          grammar::caret_message(description, text, i, fmt::format("empty name in the {}", what)));
    }
    segment_start = i + 1;
  }
}

Node text_to_string(const grammar::Text& text, bool quoted) {
  std::string value;
  for (const auto& piece : text) {
    value += piece.interpolation ? piece.interpolation->source : piece.literal;
  }
  return Node::string(std::move(value), {}, quoted);
}

// Override values keep interpolations as written: they are resolved with the rest of the
// config by resolve().
Node element_to_node(const grammar::Element& element) {
  switch (element.kind) {
    case grammar::Element::Kind::Scalar:
      return element.scalar;
    case grammar::Element::Kind::Unquoted:
      return text_to_string(element.text, false);
    case grammar::Element::Kind::Quoted:
      return text_to_string(element.text, true);
    case grammar::Element::Kind::List: {
      Node list = Node::list();
      for (const auto& item : element.items) list.push_back(element_to_node(item));
      return list;
    }
    case grammar::Element::Kind::Dict: {
      Node map = Node::map();
      for (const auto& entry : element.entries) map.set(entry.key, element_to_node(entry.value));
      return map;
    }
  }
  return Node();
}

// ---- applying

// Merges a dict override into an existing map in struct mode: every key must already exist.
void merge_existing_keys(Node& destination, const Node& source, const std::string& path,
                         const Override& override) {
  for (const auto& entry : source.entries()) {
    Node* existing = destination.child(entry.key);
    if (existing == nullptr) {
      common::fail("Could not override '{}': {} To add keys use +{}", override.key,
                   describe_missing_key(destination, path, entry.key), override.text);
    }
    if (existing->is_map() && entry.value.is_map()) {
      merge_existing_keys(*existing, entry.value, join_path(path, entry.key), override);
    } else {
      *existing = entry.value;
    }
  }
}

void assign(Node& config, const Override& override, const Node& value) {
  const auto segments = split_path(override.key);
  Node* current = &config;
  for (std::size_t i = 0; i < segments.size(); ++i) {
    Node* next = child_at(*current, segments[i]);
    if (next == nullptr) {
      common::fail("Could not override '{}': {} To add it use +{}", override.key,
                   describe_missing_key(*current, join_path(segments, i), segments[i]),
                   override.text);
    }
    current = next;
  }
  if (current->is_map() && value.is_map()) {
    merge_existing_keys(*current, value, override.key, override);
  } else {
    *current = value;
  }
}

// OmegaConf.update(cfg, key, value, merge=True, force_add=True): creates missing maps on the
// way, merges a dict into an existing map, replaces anything else.
void force_add(Node& config, const Override& override, const Node& value) {
  const auto segments = split_path(override.key);
  Node* current = &config;
  for (std::size_t i = 0; i + 1 < segments.size(); ++i) {
    Node* next = child_at(*current, segments[i]);
    if (next == nullptr) {
      if (!current->is_map()) {
        common::fail("Could not add '{}': {}", override.key,
                     describe_missing_key(*current, join_path(segments, i), segments[i]));
      }
      current->set(segments[i], Node::map());
      next = current->child(segments[i]);
    } else if (!next->is_container()) {
      if (!next->is_null()) {
        common::fail("Could not add '{}': '{}' has type {}, not map", override.key,
                     join_path(segments, i + 1), kind_name(next->kind()));
      }
      *next = Node::map();
    }
    current = next;
  }
  const std::string& last = segments.back();
  Node* target = child_at(*current, last);
  if (target != nullptr && target->is_map() && value.is_map()) {
    merge_into(*target, value);
  } else if (target != nullptr) {
    *target = value;
  } else if (current->is_map()) {
    current->set(last, value);
  } else {
    common::fail("Could not add '{}': {}", override.key,
                 describe_missing_key(*current, join_path(segments, segments.size() - 1), last));
  }
}

void remove(Node& config, const Override& override) {
  const auto segments = split_path(override.key);
  Node* parent = &config;
  for (std::size_t i = 0; i + 1 < segments.size(); ++i) {
    parent = child_at(*parent, segments[i]);
    if (parent == nullptr) break;
  }
  Node* target = parent == nullptr ? nullptr : child_at(*parent, segments.back());
  if (target == nullptr) {
    // Re-walk for the message: name the deepest existing parent.
    Node* current = &config;
    for (std::size_t i = 0; i < segments.size(); ++i) {
      Node* next = child_at(*current, segments[i]);
      if (next == nullptr) {
        common::fail("Could not delete '{}': {}", override.key,
                     describe_missing_key(*current, join_path(segments, i), segments[i]));
      }
      current = next;
    }
    common::fail("Could not delete '{}': it does not exist", override.key);
  }
  if (override.value && !(*override.value == *target)) {
    common::fail("Could not delete '{}': its value is {}, not {}", override.key,
                 python_str(*target), python_str(*override.value));
  }
  if (parent->is_map()) {
    parent->erase(segments.back());
  } else {
    auto& items = parent->items();  // target is one of them (child_at found it)
    items.erase(items.begin() + (target - items.data()));
  }
}

}  // namespace

Override parse_override(std::string_view text) {
  // Hydra's command line is text: a byte that is not UTF-8 would end up in the config, the
  // scripts and the file names. The message escapes it, so the terminal gets UTF-8 too.
  if (const auto invalid = common::first_invalid_utf8(text)) {
    common::fail("bad override '{}': invalid UTF-8 at column {} (byte 0x{:02x}); overrides must "
                 "be UTF-8 text",
                 common::escape_invalid_utf8(text), *invalid + 1,
                 static_cast<unsigned char>(text[*invalid]));
  }
  const std::string description = fmt::format("bad override '{}'", text);
  Override result;
  result.text = std::string(text);
  std::size_t position = 0;
  if (text.starts_with("~")) {
    result.kind = Override::Kind::Delete;
    position = 1;
  } else if (text.starts_with("++")) {
    result.kind = Override::Kind::ForceAdd;
    position = 2;
  } else if (text.starts_with("+")) {
    result.kind = Override::Kind::Add;
    position = 1;
  }
  const std::size_t key_start = position;
  const std::size_t equals = text.find('=', key_start);
  const std::size_t key_end = equals == std::string_view::npos ? text.size() : equals;
  if (key_end == key_start) {
    throw common::Error(grammar::caret_message(description, text, key_start,
                                               "expected a key (overrides are key=value)"));
  }
  const std::size_t at = text.substr(0, key_end).find('@', key_start);
  const std::size_t name_end = at == std::string_view::npos ? key_end : at;
  const std::string_view name = text.substr(key_start, name_end - key_start);
  if (name.find('/') != std::string_view::npos) {
    check_key_segments(text, key_start, name_end, '/', description, "config group path");
  } else {
    check_key_segments(text, key_start, name_end, '.', description, "key");
  }
  result.key = std::string(name);
  if (at != std::string_view::npos) {
    if (at + 1 < key_end) check_key_segments(text, at + 1, key_end, '.', description, "package");
    result.package = std::string(text.substr(at + 1, key_end - at - 1));
  }

  if (equals == std::string_view::npos) {
    if (result.kind == Override::Kind::Delete) return result;
    throw common::Error(
        grammar::caret_message(description, text, text.size(),
                               "missing '=' (overrides are key=value; ~key deletes a key)"));
  }
  std::size_t value_start = equals + 1;
  while (value_start < text.size() && (text[value_start] == ' ' || text[value_start] == '\t')) {
    ++value_start;
  }
  if (value_start == text.size()) {
    // "key=" sets the empty string; "~key=" is a delete without a value.
    if (result.kind != Override::Kind::Delete) result.value = Node::string("");
    return result;
  }
  result.value = element_to_node(grammar::parse_override_value(text, value_start, description));
  return result;
}

void apply_override(Node& config, const Override& override) {
  if (!config.is_map()) common::fail("cannot apply '{}': the config is not a map", override.text);
  switch (override.kind) {
    case Override::Kind::Assign:
      assign(config, override, *override.value);
      return;
    case Override::Kind::Add: {
      const Node* existing = find(config, override.key);
      const Node& value = *override.value;
      if (existing != nullptr && !existing->is_null() && !value.is_container()) {
        common::fail(
            "Could not append to config: an item is already at '{}'. Either remove the + prefix: "
            "'{}', or add a second + to add or override '{}': '+{}'",
            override.key, override.text.substr(1), override.key, override.text);
      }
      force_add(config, override, value);
      return;
    }
    case Override::Kind::ForceAdd:
      force_add(config, override, *override.value);
      return;
    case Override::Kind::Delete:
      remove(config, override);
      return;
  }
}

}  // namespace launcher
