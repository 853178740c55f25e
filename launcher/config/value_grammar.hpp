// One parser for the value grammar that Hydra's command-line overrides and OmegaConf's
// interpolations share: unquoted primitives typed by their single token (null, true/false,
// ints, floats; anything else is a string), quoted strings, [lists], {dicts} and ${...}
// interpolations, which nest.
//
// References: Hydra 1.3 override grammar (hydra/grammar/OverrideLexer.g4, OverrideParser.g4,
// https://hydra.cc/docs/1.3/advanced/override_grammar/basic/) and OmegaConf 2.2's
// interpolation grammar (omegaconf/grammar/OmegaConfGrammarLexer.g4, ...Parser.g4,
// https://omegaconf.readthedocs.io/en/2.2_branch/grammar.html). The two differ only in small
// ways, selected by Dialect:
//  - Hydra override values: `a,b` is a sweep and `f(x)` a function call (parse_override_value
//    refuses both; parse_override_sweep, for multirun, reads them); interpolations are kept as
//    written, and the backslashes that only matter to OmegaConf (before "${") are left for
//    OmegaConf to interpret at resolve time.
//  - OmegaConf resolver arguments: sequences may have empty items (""), no functions.
// Unquoted text may contain letters, digits and _-/\+.$%*@?|: and spaces; the escapes
// \\ \( \) \[ \] \{ \} \: \= \, \<space> \<tab> stand for the second character.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "launcher/config/node.hpp"

namespace launcher::grammar {

struct Interpolation;

// Literal characters (escapes already processed) or one interpolation.
struct TextPiece {
  std::string literal;
  std::shared_ptr<const Interpolation> interpolation;  // set for an interpolation piece
};
using Text = std::vector<TextPiece>;

struct DictEntry;

struct Element {
  enum class Kind {
    Scalar,    // one token: typed null/bool/int/float, or a plain string
    Unquoted,  // several tokens and/or interpolations; a string unless it is one interpolation
    Quoted,    // '...' or "...": always a string
    List,
    Dict,
  };
  Kind kind = Kind::Scalar;
  Node scalar;
  Text text;
  std::vector<Element> items;
  std::vector<DictEntry> entries;
  std::size_t position = 0;  // offset of the element in the parsed text, for error carets
  std::string source;        // as written
};

struct DictEntry {
  std::string key;
  Element value;
};

struct Interpolation {
  enum class Kind { Node, Resolver };
  Kind kind = Kind::Node;
  std::size_t leading_dots = 0;     // Node: ${.a} is 1 (the containing node), ${..a} is 2
  std::vector<Text> key;            // Node: segments; a segment may be a nested interpolation
  std::vector<Text> resolver_name;  // Resolver: "oc", "env" for ${oc.env:...}
  std::vector<Element> arguments;   // Resolver
  std::string source;               // "${...}" as written
};

// True when the text is exactly one interpolation piece (a whole-value interpolation, which
// keeps the referenced value's type).
bool is_single_interpolation(const Text& text);

// OmegaConf's top-level string grammar (configValue: text EOF): literal text and ${...}
// interpolations; "\${" is a literal "${", an even run of backslashes before an
// interpolation is halved, all other backslashes are literal. `description` starts the
// error message ("bad interpolation in 'a.b' (conf/x.yaml:3:4)").
Text parse_config_string(std::string_view text, std::string_view description);

// A Hydra override value, from `offset` to the end of `text` (the whole override, so that
// error carets point into what the user typed).
Element parse_override_value(std::string_view text, std::size_t offset,
                             std::string_view description);

// A Hydra override value as multirun reads it (OverrideParser.g4: `value: element |
// simpleChoiceSweep`, or a function call as the whole value): one element (a=1), a simple
// sweep (a=1,2,3) or a call (a=choice(1,2), a=range(start=1, stop=4)). What a function means
// is the caller's business (see sweep.hpp); the grammar only reads it.
struct SweepValue {
  enum class Kind { Element, SimpleSweep, Function };
  Kind kind = Kind::Element;
  // Element: the one element; SimpleSweep: the choices; Function: the arguments.
  std::vector<Element> items;
  std::string function;                     // Function: its name
  std::vector<std::string> argument_names;  // Function: one per item; "" when positional
  std::size_t function_position = 0;        // Function: offset of its name, for error carets
};

// Like parse_override_value, but sweeps and function calls are read rather than refused.
SweepValue parse_override_sweep(std::string_view text, std::size_t offset,
                                std::string_view description);

// "<description>: <message> at column N" followed by the text and a caret under the column.
std::string caret_message(std::string_view description, std::string_view text, std::size_t position,
                          std::string_view message);

}  // namespace launcher::grammar
