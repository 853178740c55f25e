// YAML in and out of the Node tree.
//
// Reading uses yaml-cpp's event parser only; the typing of scalars is ours and follows
// OmegaConf 2.2's loader (omegaconf._utils.get_yaml_loader): PyYAML's SafeLoader with the
// YAML 1.1 implicit resolvers, minus timestamps (dates stay strings), plus OmegaConf's float
// fix so that 1e-5 and 6e-4 are floats. Quoted, literal and folded scalars are always
// strings. Duplicate keys in one mapping are an error (as OmegaConf's loader), anchors and
// aliases are expanded (more than a million copied values is an error: a "billion laughs"
// document), and `<<` merge keys work as in PyYAML.
//
// Writing is a small block-style emitter of our own: keys in order, strings quoted exactly
// where a plain scalar would be retyped or misparsed, and keys of 128 characters or more
// written as explicit keys ("? key"), as PyYAML does, so that parse_yaml(to_yaml(tree)) equals
// the tree.
#pragma once

#include <cstddef>
#include <filesystem>
#include <string>
#include <string_view>

#include "launcher/config/node.hpp"

namespace launcher {

// The deepest nesting of lists and mappings that parse_yaml reads and to_yaml writes (yaml-cpp
// refuses documents nested about 500 deep; one limit on both sides keeps them symmetric).
inline constexpr std::size_t kMaxYamlNesting = 400;

// A missing or unreadable file, a syntax error, a duplicate key, an unknown tag: all are
// common::Error "<file>:<line>:<column>: <what>". An empty file is a Null node.
Node load_yaml_file(const std::filesystem::path& file);

// source_name stands in for the file name in locations and errors.
Node parse_yaml(std::string_view text, std::string_view source_name);

// Types an unquoted (plain) YAML scalar as OmegaConf 2.2's loader does:
//   ""  ~  null Null NULL                                  -> Null
//   true/false yes/no on/off (lower, Capitalised, UPPER)   -> Bool
//   0x1F  017 (octal)  0b101  1_000  -42  1:30 (base 60)   -> Int
//   1.5  1e-5  6E4  .5  1.  -.inf  .NaN  1_0.5  1:30.5      -> Float
//   anything else                                          -> String
Node type_plain_scalar(std::string_view text, SourceLocation location = {});

// Block-style YAML of the tree. Scalars at the top level are written as a one-line document.
// A tree nested deeper than kMaxYamlNesting is a common::Error.
std::string to_yaml(const Node& node);

}  // namespace launcher
