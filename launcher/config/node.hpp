// The launcher's config value tree: an ordered, YAML-like tree of Null, Bool, Int, Float,
// String, List and Map (insertion-ordered keys) nodes, each carrying the source location
// it came from, so that every error can point at a file:line:column or at a command-line
// override.
//
// Semantics follow OmegaConf 2.2's untyped DictConfig/ListConfig
// (https://omegaconf.readthedocs.io/en/2.2_branch/usage.html):
//  - a string is stored as written; "${...}" interpolations are resolved later (resolve() in
//    interpolate.hpp), and "???" marks a mandatory value that must be set before resolving;
//  - map keys are strings (YAML keys are kept as their text), and keys keep insertion order;
//  - dotted paths address nodes: "a.b.c", with list indices as "a.0.b" or "a[0].b".
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace launcher {

// 1-based line and column; an empty file means the value came from the command line.
struct SourceLocation {
  std::string file;
  int line = 0;
  int column = 0;

  // "conf/config.yaml:3:5", "conf/config.yaml", or "the command line".
  std::string describe() const;
};

enum class NodeKind { Null, Bool, Int, Float, String, List, Map };

// "null", "bool", "int", "float", "string", "list", "map".
std::string_view kind_name(NodeKind kind);

struct MapEntry;

class Node {
 public:
  Node() = default;  // Null

  static Node null(SourceLocation location = {});
  static Node boolean(bool value, SourceLocation location = {});
  static Node integer(std::int64_t value, SourceLocation location = {});
  static Node floating(double value, SourceLocation location = {});
  // quoted: the value was a quoted scalar in YAML or a quoted override value. It only
  // records how the value was written; "1" quoted and 1 plain differ by kind already.
  static Node string(std::string value, SourceLocation location = {}, bool quoted = false);
  static Node list(SourceLocation location = {});
  static Node map(SourceLocation location = {});

  NodeKind kind() const { return kind_; }
  bool is_null() const { return kind_ == NodeKind::Null; }
  bool is_bool() const { return kind_ == NodeKind::Bool; }
  bool is_int() const { return kind_ == NodeKind::Int; }
  bool is_float() const { return kind_ == NodeKind::Float; }
  bool is_number() const { return is_int() || is_float(); }
  bool is_string() const { return kind_ == NodeKind::String; }
  bool is_list() const { return kind_ == NodeKind::List; }
  bool is_map() const { return kind_ == NodeKind::Map; }
  bool is_container() const { return is_list() || is_map(); }
  bool is_quoted() const { return quoted_; }
  // OmegaConf's mandatory-missing marker: the string "???".
  bool is_missing() const;
  // A string that OmegaConf would parse as an interpolation: it contains "${".
  bool has_interpolation() const;

  // Typed accessors. `path` names the value in the error (e.g. "training.trainer.max_steps");
  // without it the error names the stored source location. as_double accepts ints.
  bool as_bool(std::string_view path = {}) const;
  std::int64_t as_int(std::string_view path = {}) const;
  double as_double(std::string_view path = {}) const;
  const std::string& as_string(std::string_view path = {}) const;

  // Map access. at() throws common::Error naming the key and the valid keys.
  bool contains(std::string_view key) const;
  const Node& at(std::string_view key) const;
  Node& at(std::string_view key);
  const Node* child(std::string_view key) const;  // nullptr if absent or not a map
  Node* child(std::string_view key);
  // Replaces the value in place (keeping the key's position) or appends a new key.
  void set(std::string key, Node value);
  bool erase(std::string_view key);  // false if absent
  std::vector<std::string> keys() const;
  const std::vector<MapEntry>& entries() const;
  std::vector<MapEntry>& entries();

  // List access. at() throws common::Error naming the index and the list size.
  const Node& at(std::size_t index) const;
  Node& at(std::size_t index);
  void push_back(Node value);
  const std::vector<Node>& items() const;
  std::vector<Node>& items();

  // Number of entries of a map or items of a list; 0 for scalars.
  std::size_t size() const;

  const SourceLocation& location() const { return location_; }
  void set_location(SourceLocation location) { location_ = std::move(location); }

  // Structural equality: kinds and values; ignores locations and quoting. NaN equals NaN so
  // that trees round-trip.
  friend bool operator==(const Node& left, const Node& right);

 private:
  void expect_kind(NodeKind expected, std::string_view path) const;

  NodeKind kind_ = NodeKind::Null;
  bool quoted_ = false;
  bool bool_ = false;
  std::int64_t int_ = 0;
  double float_ = 0.0;
  std::string string_;
  std::vector<Node> items_;
  std::vector<MapEntry> entries_;
  SourceLocation location_;
};

struct MapEntry {
  std::string key;
  Node value;
};

// The number of nodes in the tree: the node itself and every node below it. Readers and the
// resolver use it to refuse documents that grow exponentially (YAML aliases of aliases,
// interpolations of interpolations) before they exhaust memory.
std::size_t tree_size(const Node& node);

// ---- dotted paths

// "a.b[0].c" -> {"a", "b", "0", "c"}. Empty segments are kept, so callers can reject them.
std::vector<std::string> split_path(std::string_view path);
std::string join_path(const std::vector<std::string>& segments, std::size_t count);
// Appends a key to a dotted path: join("a.b", "c") == "a.b.c", join("", "c") == "c".
std::string join_path(std::string_view parent, std::string_view key);

// One segment of a path: the map's child of that key, or the list's item at that decimal
// index; nullptr when absent, out of range or not a number, or when `node` is a scalar.
const Node* child_at(const Node& node, std::string_view segment);
Node* child_at(Node& node, std::string_view segment);

// nullptr if any segment is absent (list segments must be decimal indices in range).
const Node* find(const Node& root, std::string_view path);
Node* find(Node& root, std::string_view path);

// Like find, but a missing segment is a common::Error naming the full path, the deepest
// existing parent, "did you mean ...?" among its keys, and the valid keys when few.
const Node& at_path(const Node& root, std::string_view path);

// The "key 'x' does not exist in 'a.b'. Did you mean 'y'? Valid keys: ..." part of a
// missing-key error; parent_path is "" for the root.
std::string describe_missing_key(const Node& parent, std::string_view parent_path,
                                 std::string_view key);

// ---- formatting

// Python's repr() of a float (shortest round-trip digits, "1e-05", "100.0", "inf", "nan"),
// which is how OmegaConf turns floats into text inside string interpolations.
std::string format_float(double value);

// Python's str() of the node's value: True/False/None, repr of floats, and Python's
// repr of lists and dicts ("[1, 'a']", "{'a': 1}"). Used for string interpolation.
std::string python_str(const Node& node);

}  // namespace launcher
